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
use std::io::Read;

use anyhow::{Context, Result, bail};
use timeshard_proto::point::SeriesPoints;
use timeshard_proto::{Point, SeriesKey};

use crate::time::parse_time;

/// A CSV reader of points.
pub(crate) struct CsvPoints<R: Read> {
    reader: csv::Reader<R>,
    series: Option<SeriesKey>,
    record: csv::StringRecord,
}

impl<R: Read> CsvPoints<R> {
    /// Points of the rows of `input`; with `series`, rows are `ts,value[,event]`.
    pub(crate) fn new(input: R, series: Option<SeriesKey>) -> CsvPoints<R> {
        let reader =
            csv::ReaderBuilder::new().has_headers(false).flexible(true).trim(csv::Trim::All).from_reader(input);
        CsvPoints { reader, series, record: csv::StringRecord::new() }
    }

    /// The next point with its series; `None` after the last row.
    pub(crate) fn next_point(&mut self) -> Result<Option<(SeriesKey, Point)>> {
        loop {
            let next_line = self.reader.position().line();
            let more = self.reader.read_record(&mut self.record).with_context(|| {
                let line = self.reader.position().line().max(next_line);
                format!("CSV line {line} is malformed")
            })?;
            if !more {
                return Ok(None);
            }
            let line = self.record.position().map_or(next_line, |p| p.line());
            let fields: Vec<&str> = self.record.iter().collect();
            if let Some(row) = row(&fields, self.series.as_ref(), line)? {
                return Ok(Some(row));
            }
        }
    }

    /// Every point left, grouped by series.
    pub(crate) fn read_all(mut self) -> Result<Vec<SeriesPoints>> {
        let mut rows = Vec::new();
        while let Some(row) = self.next_point()? {
            rows.push(row);
        }
        Ok(group(rows))
    }
}

/// One CSV row (its fields, trimmed) as (series, point); `None` for a header or a blank row.
/// `line` is the row's line in the file, for errors.
pub(crate) fn row(fields: &[&str], series: Option<&SeriesKey>, line: u64) -> Result<Option<(SeriesKey, Point)>> {
    if fields.iter().all(|f| f.is_empty()) && fields.len() <= 1 {
        return Ok(None);
    }
    let (key, rest) = match series {
        Some(s) => (s.clone(), fields),
        None => {
            let (first, rest) = fields.split_first().expect("a row that is not blank has a field");
            if line == 1 && *first == "series" {
                return Ok(None);
            }
            (first.parse().with_context(|| format!("CSV line {line}: bad series key {first:?}"))?, rest)
        }
    };
    if line == 1 && rest.first().is_some_and(|f| *f == "ts" || *f == "time") {
        return Ok(None);
    }
    if rest.len() < 2 || rest.len() > 3 {
        bail!(
            "CSV line {line} has {} fields; expected {}ts,value[,event]",
            fields.len(),
            if series.is_some() { "" } else { "series," }
        );
    }
    let ts = parse_time(rest[0]).with_context(|| format!("CSV line {line}"))?;
    let value: f64 = rest[1].parse().with_context(|| format!("CSV line {line}: bad value {:?}", rest[1]))?;
    let event = match rest.get(2) {
        Some(e) if !e.is_empty() => {
            e.parse().with_context(|| format!("CSV line {line}: bad event id {e:?} (a whole number from 0)"))?
        }
        _ => 0,
    };
    Ok(Some((key, Point { ts, value, event })))
}

/// Rows as a write batch: one entry per series, in the order series first appear.
pub(crate) fn group(rows: Vec<(SeriesKey, Point)>) -> Vec<SeriesPoints> {
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

    fn read(csv: &str, series: Option<&str>) -> Result<Vec<SeriesPoints>> {
        CsvPoints::new(csv.as_bytes(), series.map(|s| s.parse().unwrap())).read_all()
    }

    fn err(csv: &str, series: Option<&str>) -> String {
        format!("{:#}", read(csv, series).unwrap_err())
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
        let (k, p) = row(&["m{a=1}", "5", "1.5", "2"], None, 2).unwrap().unwrap();
        assert_eq!((k, p), (key.clone(), Point { ts: 5, value: 1.5, event: 2 }));
        let (_, p) = row(&["2023-11-14T22:13:20Z", "3"], Some(&key), 7).unwrap().unwrap();
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
        ] {
            let e = err(csv, series);
            assert!(e.contains(expect), "{csv:?}: {e}");
        }
        assert!(format!("{:#}", row(&["m", "x", "1"], None, 4).unwrap_err()).contains("CSV line 4"));
    }

    #[test]
    fn rows_group_by_series_in_first_appearance_order() {
        let (m, n): (SeriesKey, SeriesKey) = ("m".parse().unwrap(), "n".parse().unwrap());
        let b = group(vec![(m.clone(), Point::new(1, 1.0)), (n, Point::new(1, 2.0)), (m, Point::new(2, 3.0))]);
        assert_eq!(b.iter().map(|s| (s.series.as_str(), s.points.len())).collect::<Vec<_>>(), [("m", 2), ("n", 1)]);
    }
}
