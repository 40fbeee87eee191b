//! Writing points as CSV or JSON rows fast: numbers formatted with itoa and ryu into one
//! buffer, written out in large chunks. Values print exactly as Rust's `Display` for `f64`
//! does in CSV (what `timeshard get` always printed), and as JSON numbers in JSON.

use std::io::{self, Write};

use timeshard_formats::columns::{push_f64, push_json_f64};
use timeshard_sdk::ColumnBatch;

use crate::time::{TimeFormat, format_time};

/// Bytes gathered before they are written out.
const FLUSH_BYTES: usize = 1 << 20;

fn push_ts(buf: &mut Vec<u8>, ts: i64, time: TimeFormat, quoted: bool) {
    match time {
        TimeFormat::Ns => buf.extend_from_slice(itoa::Buffer::new().format(ts).as_bytes()),
        TimeFormat::Rfc3339 if quoted => {
            let _ = write!(buf, "\"{}\"", format_time(ts, time));
        }
        TimeFormat::Rfc3339 => buf.extend_from_slice(format_time(ts, time).as_bytes()),
    }
}

/// Points written as rows, batch by batch.
pub(crate) struct Rows<W: Write> {
    out: W,
    buf: Vec<u8>,
    json: bool,
    time: TimeFormat,
    rows: u64,
}

impl<W: Write> Rows<W> {
    /// Rows of CSV (`json` false: a `ts,value,event` header) or JSON (an object naming
    /// `series` with the points in an array) on `out`.
    pub(crate) fn start(out: W, json: bool, time: TimeFormat, series: &str) -> io::Result<Rows<W>> {
        let mut rows = Rows { out, buf: Vec::with_capacity(FLUSH_BYTES + 4096), json, time, rows: 0 };
        if json {
            let name = serde_json::to_string(series).map_err(io::Error::other)?;
            let _ = write!(rows.buf, "{{\n  \"series\": {name},\n  \"points\": [");
        } else {
            rows.buf.extend_from_slice(b"ts,value,event\n");
        }
        Ok(rows)
    }

    /// Appends the points of `batch`.
    pub(crate) fn batch(&mut self, batch: &ColumnBatch) -> io::Result<()> {
        let mut ev = itoa::Buffer::new();
        for p in batch.points() {
            if self.json {
                self.buf.extend_from_slice(if self.rows == 0 { b"\n    {\"ts\": " } else { b",\n    {\"ts\": " });
                push_ts(&mut self.buf, p.ts, self.time, true);
                self.buf.extend_from_slice(b", \"value\": ");
                push_json_f64(&mut self.buf, p.value);
                self.buf.extend_from_slice(b", \"event\": ");
                self.buf.extend_from_slice(ev.format(p.event).as_bytes());
                self.buf.push(b'}');
            } else {
                push_ts(&mut self.buf, p.ts, self.time, false);
                self.buf.push(b',');
                push_f64(&mut self.buf, p.value);
                self.buf.push(b',');
                self.buf.extend_from_slice(ev.format(p.event).as_bytes());
                self.buf.push(b'\n');
            }
            self.rows += 1;
            if self.buf.len() >= FLUSH_BYTES {
                self.out.write_all(&self.buf)?;
                self.buf.clear();
            }
        }
        Ok(())
    }

    /// Closes the JSON document and writes out what is left.
    pub(crate) fn finish(mut self) -> io::Result<()> {
        if self.json {
            self.buf.extend_from_slice(if self.rows == 0 { b"]\n}\n" } else { b"\n  ]\n}\n" });
        }
        self.out.write_all(&self.buf)?;
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use timeshard_sdk::Point;

    #[test]
    fn csv_and_json_rows() {
        let batch = ColumnBatch::from_points(&[Point::new(1, 1.5), Point { ts: 2, value: f64::NAN, event: 7 }]);
        let mut out = Vec::new();
        let mut rows = Rows::start(&mut out, false, TimeFormat::Ns, "m").unwrap();
        rows.batch(&batch).unwrap();
        rows.finish().unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "ts,value,event\n1,1.5,0\n2,NaN,7\n");
        let mut out = Vec::new();
        let mut rows = Rows::start(&mut out, true, TimeFormat::Ns, "m{a=\"}").unwrap();
        rows.batch(&batch).unwrap();
        rows.finish().unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(doc["series"], "m{a=\"}");
        assert_eq!(doc["points"][0]["value"], 1.5);
        assert_eq!(doc["points"][1]["value"], "NaN");
        assert_eq!(doc["points"][1]["event"], 7);
        let mut out = Vec::new();
        Rows::start(&mut out, true, TimeFormat::Ns, "m").unwrap().finish().unwrap();
        assert_eq!(serde_json::from_slice::<serde_json::Value>(&out).unwrap()["points"], serde_json::json!([]));
    }
}
