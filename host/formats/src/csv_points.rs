//! Points read from CSV rows: the one row parser of `timeshard put` and `timeshard import`.
//!
//! Rows are `series,ts,value[,event]`, or `ts,value[,event]` when the series is given. Fields
//! are trimmed; series keys hold commas, so they are quoted (`"m{a=1,b=2}",5,1.5`). A header on
//! the first line (`series,...`, `ts,...` or `time,...`) is skipped, and so are blank lines.
//! An empty event field means event 0, as a missing one does. Errors name the line and the
//! field that is wrong. Lines are the csv reader's count, which is a text editor's except for
//! the row right after blank lines: that one is named by the first blank line
//! (BurntSushi/rust-csv#208).

use std::collections::HashMap;
use std::io::{self, Read};

use timeshard_proto::point::SeriesPoints;
use timeshard_proto::{Point, SeriesKey};

use crate::timestamps::{TimeError, parse_timestamp};

/// The longest line a CSV file may hold (a row is a series key of at most 1 KiB and three
/// numbers; a longer line is not a row of points), so that a line without an end is refused
/// before it is held whole.
pub const MAX_LINE_BYTES: usize = 64 << 10;

/// Why CSV input could not be read as points; every variant names the line.
#[derive(Debug, thiserror::Error)]
pub enum CsvError {
    #[error("CSV line {line} is longer than {limit} bytes: a row is series,ts,value[,event]")]
    LineTooLong { line: u64, limit: usize },
    #[error("CSV line {line} is malformed: {message}")]
    Malformed { line: u64, message: String },
    #[error("CSV line {line}: bad series key {key:?}: {reason}")]
    BadSeriesKey { line: u64, key: String, reason: String },
    #[error("CSV line {line} has {got} fields; expected {expected}")]
    FieldCount { line: u64, got: usize, expected: &'static str },
    #[error("CSV line {line}: {source}")]
    BadTime {
        line: u64,
        #[source]
        source: TimeError,
    },
    #[error("CSV line {line}: bad value {value:?}: {reason}")]
    BadValue { line: u64, value: String, reason: String },
    #[error("CSV line {line}: bad event id {value:?} (a whole number from 0)")]
    BadEvent { line: u64, value: String },
}

/// A reader that refuses a line longer than [`MAX_LINE_BYTES`] as its bytes arrive.
#[derive(Debug)]
struct BoundedLines<R> {
    inner: R,
    /// Bytes since the last newline.
    run: usize,
    too_long: bool,
}

impl<R: Read> Read for BoundedLines<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.too_long {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "line too long"));
        }
        let n = self.inner.read(buf)?;
        for &b in &buf[..n] {
            self.run = if b == b'\n' { 0 } else { self.run + 1 };
            if self.run > MAX_LINE_BYTES {
                self.too_long = true;
                return Err(io::Error::new(io::ErrorKind::InvalidData, "line too long"));
            }
        }
        Ok(n)
    }
}

/// A CSV reader of points.
#[derive(Debug)]
pub struct CsvPoints<R: Read> {
    reader: csv::Reader<BoundedLines<R>>,
    series: Option<SeriesKey>,
    record: csv::StringRecord,
    now_ns: i64,
}

impl<R: Read> CsvPoints<R> {
    /// Points of the rows of `input`; with `series`, rows are `ts,value[,event]`. `now_ns` is
    /// what a `now` or `now-15m` time means.
    pub fn new(input: R, series: Option<SeriesKey>, now_ns: i64) -> CsvPoints<R> {
        let reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .trim(csv::Trim::All)
            .from_reader(BoundedLines { inner: input, run: 0, too_long: false });
        CsvPoints { reader, series, record: csv::StringRecord::new(), now_ns }
    }

    /// The next point with its series; `None` after the last row.
    pub fn next_point(&mut self) -> Result<Option<(SeriesKey, Point)>, CsvError> {
        loop {
            let next_line = self.reader.position().line();
            let more = self.reader.read_record(&mut self.record).map_err(|e| {
                let line = self.reader.position().line().max(next_line);
                if self.reader.get_ref().too_long {
                    CsvError::LineTooLong { line, limit: MAX_LINE_BYTES }
                } else {
                    CsvError::Malformed { line, message: e.to_string() }
                }
            })?;
            if !more {
                return Ok(None);
            }
            let line = self.record.position().map_or(next_line, |p| p.line());
            let fields: Vec<&str> = self.record.iter().collect();
            if let Some(row) = row(&fields, self.series.as_ref(), line, self.now_ns)? {
                return Ok(Some(row));
            }
        }
    }

    /// Every point left, grouped by series.
    pub fn read_all(mut self) -> Result<Vec<SeriesPoints>, CsvError> {
        let mut rows = Vec::new();
        while let Some(row) = self.next_point()? {
            rows.push(row);
        }
        Ok(group(rows))
    }
}

/// One CSV row (its fields, trimmed) as (series, point); `None` for a header or a blank row.
/// `line` is the row's line in the file, for errors.
pub fn row(
    fields: &[&str],
    series: Option<&SeriesKey>,
    line: u64,
    now_ns: i64,
) -> Result<Option<(SeriesKey, Point)>, CsvError> {
    if fields.iter().all(|f| f.is_empty()) && fields.len() <= 1 {
        return Ok(None);
    }
    let (key, rest) =
        match series {
            Some(s) => (s.clone(), fields),
            None => {
                let Some((first, rest)) = fields.split_first() else { return Ok(None) };
                if line == 1 && *first == "series" {
                    return Ok(None);
                }
                let key = first.parse().map_err(|e: timeshard_proto::series::SeriesKeyError| {
                    CsvError::BadSeriesKey { line, key: first.to_string(), reason: e.to_string() }
                })?;
                (key, rest)
            }
        };
    if line == 1 && rest.first().is_some_and(|f| *f == "ts" || *f == "time") {
        return Ok(None);
    }
    if rest.len() < 2 || rest.len() > 3 {
        let expected = if series.is_some() { "ts,value[,event]" } else { "series,ts,value[,event]" };
        return Err(CsvError::FieldCount { line, got: fields.len(), expected });
    }
    let ts = parse_timestamp(rest[0], now_ns).map_err(|source| CsvError::BadTime { line, source })?;
    let value: f64 = rest[1].parse().map_err(|e: std::num::ParseFloatError| CsvError::BadValue {
        line,
        value: rest[1].to_string(),
        reason: e.to_string(),
    })?;
    let event = match rest.get(2) {
        Some(e) if !e.is_empty() => e.parse().map_err(|_| CsvError::BadEvent { line, value: e.to_string() })?,
        _ => 0,
    };
    Ok(Some((key, Point { ts, value, event })))
}

/// Rows as a write batch: one entry per series, in the order series first appear.
pub fn group(rows: Vec<(SeriesKey, Point)>) -> Vec<SeriesPoints> {
    let mut out: Vec<SeriesPoints> = Vec::new();
    let mut index: HashMap<SeriesKey, usize> = HashMap::new();
    for (series, p) in rows {
        match index.get(&series) {
            Some(&i) => out[i].points.push(p),
            None => {
                index.insert(series.clone(), out.len());
                out.push(SeriesPoints { series, points: vec![p] });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2023-11-14T22:13:20Z: what `now` means here.
    const NOW: i64 = 1_700_000_000_000_000_000;

    fn read(csv: &str, series: Option<&str>) -> Result<Vec<SeriesPoints>, CsvError> {
        CsvPoints::new(csv.as_bytes(), series.map(|s| s.parse().unwrap()), NOW).read_all()
    }

    fn err(csv: &str, series: Option<&str>) -> String {
        read(csv, series).unwrap_err().to_string()
    }

    #[test]
    fn both_layouts_and_their_headers() {
        let got = read("ts,value\n1,2.5\n2,3.5,7\n", Some("m")).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].points, vec![Point::new(1, 2.5), Point { ts: 2, value: 3.5, event: 7 }]);
        let got = read("series,ts,value\n\"a{x=1,y=2}\",1,2\nb,2,3\n", None).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].series.as_str(), "a{x=1,y=2}");
        assert_eq!(read("time,value\n1,2\n", Some("m")).unwrap()[0].points.len(), 1);
        // A header is only a header on the first line.
        assert!(err("1,2\nts,value\n", Some("m")).contains("CSV line 2"));
        let key: SeriesKey = "m{a=1}".parse().unwrap();
        let (k, p) = row(&["m{a=1}", "5", "1.5", "2"], None, 2, NOW).unwrap().unwrap();
        assert_eq!((k, p), (key.clone(), Point { ts: 5, value: 1.5, event: 2 }));
        let (_, p) = row(&["2023-11-14T22:13:20Z", "3"], Some(&key), 7, NOW).unwrap().unwrap();
        assert_eq!(p.ts, 1_700_000_000_000_000_000);
    }

    /// `put` read an empty event field as event 0 and `import` refused it; both take it as 0.
    #[test]
    fn an_empty_event_field_is_event_zero() {
        let got = read("ts,value,event\n2023-11-14T22:13:21Z,3.25,\n5,1,\"\"\n", Some("m")).unwrap();
        assert_eq!(got[0].points.iter().map(|p| p.event).collect::<Vec<_>>(), vec![0, 0]);
        let got = read("m,5,1.5,\n", None).unwrap();
        assert_eq!(got[0].points, vec![Point::new(5, 1.5)]);
    }

    #[test]
    fn whitespace_quotes_and_blank_lines() {
        let got = read("\"m{a=1,b=2}\",  5 , 1.5 ,  3 \n\n \t\n\"n\",\"6\",\" -2\"\n", None).unwrap();
        assert_eq!(got[0].series.as_str(), "m{a=1,b=2}");
        assert_eq!(got[0].points, vec![Point { ts: 5, value: 1.5, event: 3 }]);
        assert_eq!(got[1].points, vec![Point::new(6, -2.0)]);
        // An unquoted key with commas reads as more fields, and says so.
        assert!(err("m{a=1,b=2},5,1.5\n", None).contains("CSV line 1: bad series key \"m{a=1\""));
    }

    #[test]
    fn bad_rows_name_their_line_and_field() {
        for (csv, series, expect) in [
            ("1,2\n3,oops\n", Some("m"), "CSV line 2: bad value \"oops\""),
            ("1,2\n\n3,4\n5,oops\n", Some("m"), "CSV line 4: bad value \"oops\""),
            ("1,2,x\n", Some("m"), "CSV line 1: bad event id \"x\""),
            ("1,2,-1\n", Some("m"), "CSV line 1: bad event id \"-1\""),
            ("yesterday,2\n", Some("m"), "CSV line 1"),
            ("1\n", Some("m"), "CSV line 1 has 1 fields; expected ts,value[,event]"),
            ("m,5\n", None, "CSV line 1 has 2 fields; expected series,ts,value[,event]"),
            ("m,1,2,3,4\n", None, "CSV line 1 has 5 fields"),
            ("bad key,1,2\n", None, "CSV line 1: bad series key \"bad key\""),
            ("m,1,2\n\"m,1,2\n", None, "CSV line 2"),
            ("now-1s,2\nnow-soon,3\n", Some("m"), "CSV line 2: bad duration"),
        ] {
            let e = err(csv, series);
            assert!(e.contains(expect), "{csv:?}: {e}");
        }
        assert!(row(&["m", "x", "1"], None, 4, NOW).unwrap_err().to_string().contains("CSV line 4"));
    }

    #[test]
    fn rows_group_by_series_in_first_appearance_order() {
        let (m, n): (SeriesKey, SeriesKey) = ("m".parse().unwrap(), "n".parse().unwrap());
        let b = group(vec![(m.clone(), Point::new(1, 1.0)), (n, Point::new(1, 2.0)), (m, Point::new(2, 3.0))]);
        assert_eq!(b.iter().map(|s| (s.series.as_str(), s.points.len())).collect::<Vec<_>>(), [("m", 2), ("n", 1)]);
    }

    /// A line that never ends is refused once it passes the limit, not held whole.
    #[test]
    fn a_line_past_the_limit_is_refused_by_its_number() {
        let long = format!("m,1,2\n{}\n", "9".repeat(MAX_LINE_BYTES + 1));
        assert!(matches!(read(&long, None), Err(CsvError::LineTooLong { line: 2, .. })), "{:?}", read(&long, None));
        // Just under the limit is an ordinary row.
        let under = format!("m,1,{}\n", "9".repeat(MAX_LINE_BYTES - 10));
        assert!(read(&under, None).is_ok());
    }

    /// A long series key of multi-byte characters used to panic where its error message cut
    /// it inside a character (found by review while adding the `csv_points` fuzz target).
    #[test]
    fn a_long_key_of_wide_characters_is_an_error_not_a_panic() {
        let key = format!("m{}", "é".repeat(600));
        assert!(matches!(read(&format!("{key},1,2\n"), None), Err(CsvError::BadSeriesKey { line: 1, .. })));
    }
}
