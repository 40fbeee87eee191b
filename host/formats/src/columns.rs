//! Raw points written out as they stream, batch by batch, without holding the range: JSON in
//! columns, CSV rows, an Arrow IPC stream and Parquet (the node's `/v1/read`), with the number formatting
//! `timeshard get` shares. Numbers are formatted with itoa and ryu straight into the caller's
//! buffer.
//!
//! JSON: `{"series":"<key>","chunks":[{"ts":[..],"value":[..],"event":[..]},..],"count":N,"next":<cursor>|null}`,
//! one chunk per batch, so a reader can start on the first chunk before the last is written;
//! values JSON cannot hold (NaN, the infinities) are strings, as everywhere in the API.
//! CSV: a `ts,value,event` header, then one row per point; values print as Rust's `Display`.
//! Arrow: an IPC stream (`application/vnd.apache.arrow.stream`), one record batch per batch,
//! columns `ts` (timestamp, nanoseconds, UTC), `value` (float64) and `event` (uint64), the
//! series key in the schema's metadata (`timeshard.series`).
//! Parquet: columns `ts` (timestamp, nanoseconds, UTC), `value` (double) and `event` (unsigned
//! 64-bit), zstd pages, a row group per [`PARQUET_ROW_GROUP`] points, written out as each
//! group closes; the series key is in the file's metadata (`timeshard.series`).

use std::io::Write;
use std::sync::Arc;

use arrow_array::{Float64Array, RecordBatch, TimestampNanosecondArray, UInt64Array};
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{ArrowError, DataType, Field, Schema, TimeUnit};
use parquet::basic::{Compression, ZstdLevel};
use parquet::data_type::{DoubleType, Int64Type};
use parquet::errors::ParquetError;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use timeshard_proto::point::ColumnBatch;

/// Points a Parquet row group holds (the last may hold fewer): large enough for the columns to
/// compress, small enough that an answer holds little.
pub const PARQUET_ROW_GROUP: usize = 65_536;

const PARQUET_SCHEMA: &str = "message points {
    REQUIRED INT64 ts (TIMESTAMP(NANOS, true));
    REQUIRED DOUBLE value;
    REQUIRED INT64 event (INTEGER(64, false));
}";

/// Appends `v` as `Display` prints it: integers without a fraction, never an exponent.
pub fn push_f64(buf: &mut Vec<u8>, v: f64) {
    if v.is_finite() && v == v.trunc() && v.abs() < 1e15 {
        if v == 0.0 && v.is_sign_negative() {
            buf.extend_from_slice(b"-0");
        } else {
            buf.extend_from_slice(itoa::Buffer::new().format(v as i64).as_bytes());
        }
        return;
    }
    if v.is_finite() {
        let mut r = ryu::Buffer::new();
        let s = r.format_finite(v);
        if !s.contains('e') && !s.ends_with(".0") {
            buf.extend_from_slice(s.as_bytes());
            return;
        }
    }
    let _ = write!(buf, "{v}");
}

/// Appends `v` as a JSON value: a number, or a string for NaN and the infinities (JSON has
/// none of them).
pub fn push_json_f64(buf: &mut Vec<u8>, v: f64) {
    if v.is_finite() {
        buf.extend_from_slice(ryu::Buffer::new().format_finite(v).as_bytes());
    } else {
        let _ = write!(buf, "\"{v}\"");
    }
}

/// How a raw read is written out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnsFormat {
    Json,
    Csv,
    Arrow,
    Parquet,
}

/// Why an answer could not be written (Arrow and Parquet only: JSON and CSV always write).
#[derive(Debug, thiserror::Error)]
pub enum ColumnsError {
    #[error("Arrow: {0}")]
    Arrow(#[from] ArrowError),
    #[error("Parquet: {0}")]
    Parquet(#[from] ParquetError),
}

impl ColumnsFormat {
    /// The media type the answer declares.
    pub fn content_type(self) -> &'static str {
        match self {
            ColumnsFormat::Json => "application/json",
            ColumnsFormat::Csv => "text/csv; charset=utf-8",
            ColumnsFormat::Arrow => "application/vnd.apache.arrow.stream",
            ColumnsFormat::Parquet => "application/vnd.apache.parquet",
        }
    }
}

/// Writes a read's points batch by batch; each call appends to the caller's buffer, which
/// the caller sends and clears.
pub struct ColumnsWriter {
    format: ColumnsFormat,
    chunks: u64,
    points: u64,
    parquet: Option<Box<ParquetOut>>,
    arrow: Option<Box<ArrowOut>>,
}

/// An Arrow IPC stream written into a buffer that is emptied after each batch.
struct ArrowOut {
    schema: Arc<Schema>,
    stream: StreamWriter<Vec<u8>>,
}

impl ArrowOut {
    fn new(series: &str, buf: &mut Vec<u8>) -> Result<ArrowOut, ArrowError> {
        let fields = vec![
            Field::new("ts", DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())), false),
            Field::new("value", DataType::Float64, false),
            Field::new("event", DataType::UInt64, false),
        ];
        let metadata = std::collections::HashMap::from([("timeshard.series".to_string(), series.to_string())]);
        let schema = Arc::new(Schema::new_with_metadata(fields, metadata));
        let mut stream = StreamWriter::try_new(Vec::new(), &schema)?;
        buf.append(stream.get_mut());
        Ok(ArrowOut { schema, stream })
    }

    fn write(&mut self, batch: &ColumnBatch, buf: &mut Vec<u8>) -> Result<(), ArrowError> {
        let columns: Vec<arrow_array::ArrayRef> = vec![
            Arc::new(TimestampNanosecondArray::from(batch.timestamps.clone()).with_timezone("UTC")),
            Arc::new(Float64Array::from(batch.values.clone())),
            Arc::new(UInt64Array::from(batch.events.clone())),
        ];
        self.stream.write(&RecordBatch::try_new(self.schema.clone(), columns)?)?;
        // The stream writes straight through (no buffer of its own).
        buf.append(self.stream.get_mut());
        Ok(())
    }
}

/// A Parquet file being written into a buffer that is emptied as each row group closes.
struct ParquetOut {
    file: SerializedFileWriter<Vec<u8>>,
    /// Points of the row group not yet written.
    group: ColumnBatch,
}

impl ParquetOut {
    fn new(series: &str) -> Result<ParquetOut, ParquetError> {
        let schema = Arc::new(parse_message_type(PARQUET_SCHEMA)?);
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(1)?))
            .set_key_value_metadata(Some(vec![KeyValue::new("timeshard.series".into(), series.to_string())]))
            .build();
        Ok(ParquetOut {
            file: SerializedFileWriter::new(Vec::new(), schema, Arc::new(props))?,
            group: ColumnBatch::default(),
        })
    }

    /// Writes the pending points as one row group, and moves what the file wrote to `buf`.
    fn write_group(&mut self, buf: &mut Vec<u8>) -> Result<(), ParquetError> {
        if !self.group.is_empty() {
            let g = std::mem::take(&mut self.group);
            let events: Vec<i64> = g.events.iter().map(|&e| e as i64).collect();
            let mut rows = self.file.next_row_group()?;
            for column in 0..3 {
                let mut col = rows.next_column()?.ok_or_else(|| ParquetError::General("a column short".into()))?;
                match column {
                    0 => col.typed::<Int64Type>().write_batch(&g.timestamps, None, None)?,
                    1 => col.typed::<DoubleType>().write_batch(&g.values, None, None)?,
                    // Unsigned 64-bit in a signed column, as Parquet stores UINT64.
                    _ => col.typed::<Int64Type>().write_batch(&events, None, None)?,
                };
                col.close()?;
            }
            rows.close()?;
        }
        self.file.flush()?;
        // Only bytes the file already wrote out leave: its offsets count them on its own.
        buf.append(self.file.inner_mut());
        Ok(())
    }
}

impl std::fmt::Debug for ColumnsWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ColumnsWriter").field("format", &self.format).field("points", &self.points).finish()
    }
}

impl ColumnsWriter {
    /// Starts the answer for `series`: the JSON document's head, the CSV header, or the
    /// Parquet file's magic.
    pub fn start(format: ColumnsFormat, series: &str, buf: &mut Vec<u8>) -> Result<ColumnsWriter, ColumnsError> {
        let (mut parquet, mut arrow) = (None, None);
        match format {
            ColumnsFormat::Json => {
                buf.extend_from_slice(b"{\"series\":");
                push_json_string(buf, series);
                buf.extend_from_slice(b",\"chunks\":[");
            }
            ColumnsFormat::Csv => buf.extend_from_slice(b"ts,value,event\n"),
            ColumnsFormat::Arrow => arrow = Some(Box::new(ArrowOut::new(series, buf)?)),
            ColumnsFormat::Parquet => {
                let mut out = Box::new(ParquetOut::new(series)?);
                out.write_group(buf)?;
                parquet = Some(out);
            }
        }
        Ok(ColumnsWriter { format, chunks: 0, points: 0, parquet, arrow })
    }

    /// Appends the points of `batch` (nothing for an empty one; Parquet holds them until its
    /// row group fills).
    pub fn batch(&mut self, batch: &ColumnBatch, buf: &mut Vec<u8>) -> Result<(), ColumnsError> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut ints = itoa::Buffer::new();
        match self.format {
            ColumnsFormat::Json => {
                buf.reserve(batch.len() * 40);
                if self.chunks > 0 {
                    buf.push(b',');
                }
                buf.extend_from_slice(b"{\"ts\":[");
                push_list(buf, &batch.timestamps, |buf, ts| buf.extend_from_slice(ints.format(*ts).as_bytes()));
                buf.extend_from_slice(b"],\"value\":[");
                push_list(buf, &batch.values, |buf, v| push_json_f64(buf, *v));
                buf.extend_from_slice(b"],\"event\":[");
                push_list(buf, &batch.events, |buf, e| buf.extend_from_slice(ints.format(*e).as_bytes()));
                buf.extend_from_slice(b"]}");
            }
            ColumnsFormat::Csv => {
                buf.reserve(batch.len() * 32);
                for p in batch.points() {
                    buf.extend_from_slice(ints.format(p.ts).as_bytes());
                    buf.push(b',');
                    push_f64(buf, p.value);
                    buf.push(b',');
                    buf.extend_from_slice(ints.format(p.event).as_bytes());
                    buf.push(b'\n');
                }
            }
            ColumnsFormat::Arrow => self.arrow.as_mut().expect("an Arrow writer has its stream").write(batch, buf)?,
            ColumnsFormat::Parquet => {
                let out = self.parquet.as_mut().expect("a Parquet writer has its file");
                out.group.timestamps.extend_from_slice(&batch.timestamps);
                out.group.values.extend_from_slice(&batch.values);
                out.group.events.extend_from_slice(&batch.events);
                if out.group.len() >= PARQUET_ROW_GROUP {
                    out.write_group(buf)?;
                }
            }
        }
        self.chunks += 1;
        self.points += batch.len() as u64;
        Ok(())
    }

    /// Points written so far.
    pub fn points(&self) -> u64 {
        self.points
    }

    /// Ends the answer: the JSON document's count and the cursor to continue from (`next`,
    /// when a limit cut the read short), the Arrow stream's end, or the Parquet file's last row
    /// group and footer. Only JSON has a place for a cursor.
    pub fn finish(self, next: Option<&str>, buf: &mut Vec<u8>) -> Result<(), ColumnsError> {
        match self.format {
            ColumnsFormat::Json => {
                let _ = write!(buf, "],\"count\":{},\"next\":", self.points);
                match next {
                    Some(cursor) => push_json_string(buf, cursor),
                    None => buf.extend_from_slice(b"null"),
                }
                buf.extend_from_slice(b"}\n");
            }
            ColumnsFormat::Csv => {}
            ColumnsFormat::Arrow => {
                let mut out = self.arrow.expect("an Arrow writer has its stream");
                out.stream.finish()?;
                buf.append(out.stream.get_mut());
            }
            ColumnsFormat::Parquet => {
                let mut out = self.parquet.expect("a Parquet writer has its file");
                out.write_group(buf)?;
                buf.append(&mut out.file.into_inner()?);
            }
        }
        Ok(())
    }
}

/// Appends `items` separated by commas, each as `push` writes it.
fn push_list<T>(buf: &mut Vec<u8>, items: &[T], mut push: impl FnMut(&mut Vec<u8>, &T)) {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        push(buf, item);
    }
}

fn push_json_string(buf: &mut Vec<u8>, s: &str) {
    // A `String` always serialises.
    serde_json::to_writer(&mut *buf, s).expect("a string as JSON");
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};
    use timeshard_proto::Point;

    use super::*;

    fn written(format: ColumnsFormat, batches: &[ColumnBatch], next: Option<&str>) -> String {
        String::from_utf8(written_bytes(format, batches, next)).unwrap()
    }

    fn written_bytes(format: ColumnsFormat, batches: &[ColumnBatch], next: Option<&str>) -> Vec<u8> {
        let mut buf: Vec<u8> = Vec::new();
        let mut w = ColumnsWriter::start(format, "m{a=\"}", &mut buf).unwrap();
        for b in batches {
            w.batch(b, &mut buf).unwrap();
        }
        w.finish(next, &mut buf).unwrap();
        buf
    }

    #[test]
    fn values_print_as_display_does() {
        for v in [
            0.0,
            -0.0,
            1.0,
            -4.0,
            1.5,
            3.25,
            49.98,
            0.1,
            1e-7,
            123456.789,
            1e15,
            1e16,
            1.5e300,
            -2.5e-300,
            1e21,
            f64::MAX,
            f64::MIN_POSITIVE,
            9007199254740993.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ] {
            let mut buf = Vec::new();
            push_f64(&mut buf, v);
            assert_eq!(String::from_utf8(buf).unwrap(), v.to_string(), "{v:e}");
        }
    }

    #[test]
    fn json_chunks_hold_the_columns_of_each_batch() {
        let a = ColumnBatch::from_points(&[Point::new(1, 1.5), Point { ts: 2, value: f64::NAN, event: 7 }]);
        let b = ColumnBatch::from_points(&[Point::new(-3, f64::NEG_INFINITY)]);
        let doc: Value = serde_json::from_str(&written(ColumnsFormat::Json, &[a, ColumnBatch::default(), b], None))
            .expect("valid JSON");
        assert_eq!(
            doc,
            json!({"series": "m{a=\"}", "chunks": [
                {"ts": [1, 2], "value": [1.5, "NaN"], "event": [0, 7]},
                {"ts": [-3], "value": ["-inf"], "event": [0]},
            ], "count": 3, "next": null})
        );
    }

    #[test]
    fn an_empty_json_answer_and_a_cursor() {
        let doc: Value = serde_json::from_str(&written(ColumnsFormat::Json, &[], Some("5.0.0"))).unwrap();
        assert_eq!(doc, json!({"series": "m{a=\"}", "chunks": [], "count": 0, "next": "5.0.0"}));
    }

    #[test]
    fn csv_rows_follow_one_header() {
        let a = ColumnBatch::from_points(&[Point::new(1, 1.5), Point { ts: 2, value: f64::NAN, event: 7 }]);
        let b = ColumnBatch::from_points(&[Point::new(3, 1e21)]);
        assert_eq!(
            written(ColumnsFormat::Csv, &[a, b], Some("ignored")),
            "ts,value,event\n1,1.5,0\n2,NaN,7\n3,1000000000000000000000,0\n"
        );
        assert_eq!(written(ColumnsFormat::Csv, &[], None), "ts,value,event\n");
    }

    #[test]
    fn parquet_holds_every_point_in_row_groups_written_as_they_fill() {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        use parquet::record::Field;

        let n = PARQUET_ROW_GROUP * 2 + 100;
        let points: Vec<Point> =
            (0..n as i64).map(|i| Point { ts: i * 10, value: i as f64 / 8.0, event: i as u64 % 3 }).collect();
        let batches: Vec<ColumnBatch> = points.chunks(16_384).map(ColumnBatch::from_points).collect();
        // Bytes leave as each row group closes, not all at the end.
        let mut buf = Vec::new();
        let mut w = ColumnsWriter::start(ColumnsFormat::Parquet, "m{a=1}", &mut buf).unwrap();
        assert_eq!(buf, b"PAR1");
        let mut sent = Vec::new();
        for b in &batches {
            w.batch(b, &mut buf).unwrap();
            sent.push(buf.len());
        }
        assert!(
            sent[4] > 4 && sent[4] < sent[8],
            "a row group leaves once {PARQUET_ROW_GROUP} points are in: {sent:?}"
        );
        w.finish(None, &mut buf).unwrap();

        let file = SerializedFileReader::new(bytes::Bytes::from(buf)).unwrap();
        let meta = file.metadata();
        assert_eq!(meta.num_row_groups(), 3);
        let kv = meta.file_metadata().key_value_metadata().unwrap();
        assert!(kv.iter().any(|k| k.key == "timeshard.series" && k.value.as_deref() == Some("m{a=1}")));
        let rows: Vec<Point> = file
            .get_row_iter(None)
            .unwrap()
            .map(|row| {
                let row = row.unwrap();
                let mut cols = row.get_column_iter().map(|(_, f)| f.clone());
                match (cols.next(), cols.next(), cols.next()) {
                    (Some(Field::Long(ts)), Some(Field::Double(value)), Some(Field::ULong(event))) => {
                        Point { ts, value, event }
                    }
                    other => panic!("unexpected row {other:?}"),
                }
            })
            .collect();
        assert!(rows == points, "the file's rows are the points written");
        // An empty answer is a valid file too.
        let empty = written_bytes(ColumnsFormat::Parquet, &[], None);
        assert_eq!(SerializedFileReader::new(bytes::Bytes::from(empty)).unwrap().metadata().num_row_groups(), 0);
    }

    #[test]
    fn arrow_streams_one_record_batch_per_batch() {
        let a = ColumnBatch::from_points(&[Point::new(1, 1.5), Point { ts: 2, value: f64::NAN, event: 7 }]);
        let b = ColumnBatch::from_points(&[Point::new(3, -4.0)]);
        let bytes = written_bytes(ColumnsFormat::Arrow, &[a, ColumnBatch::default(), b], None);
        let reader = arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None).unwrap();
        assert_eq!(reader.schema().metadata()["timeshard.series"], "m{a=\"}");
        let batches: Vec<RecordBatch> = reader.collect::<Result<_, _>>().unwrap();
        assert_eq!(batches.iter().map(RecordBatch::num_rows).collect::<Vec<_>>(), [2, 1]);
        let column = |b: &RecordBatch, i: usize| b.column(i).clone();
        let ts = column(&batches[0], 0);
        let ts = ts.as_any().downcast_ref::<TimestampNanosecondArray>().unwrap();
        assert_eq!(ts.values(), &[1, 2]);
        let values = column(&batches[0], 1);
        let values = values.as_any().downcast_ref::<Float64Array>().unwrap();
        assert!(values.value(0) == 1.5 && values.value(1).is_nan());
        let events = column(&batches[0], 2);
        assert_eq!(events.as_any().downcast_ref::<UInt64Array>().unwrap().values(), &[0, 7]);
        // An empty answer is a stream with its schema and no batch.
        let empty = written_bytes(ColumnsFormat::Arrow, &[], None);
        let reader = arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(empty), None).unwrap();
        assert_eq!(reader.count(), 0);
    }
}
