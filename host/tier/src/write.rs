//! Streaming Parquet writers: points files a row group at a time (the caller drains the encoded
//! bytes after each one, so memory holds one row group, never a file), and manifests.

use std::sync::Arc;

use bytes::Bytes;
use parquet::column::writer::ColumnWriter;
use parquet::data_type::ByteArray;
use parquet::errors::ParquetError;
use parquet::file::metadata::{KeyValue, ParquetMetaData};
use parquet::file::writer::SerializedFileWriter;
use timeshard_proto::{Point, SeriesKey};

use crate::manifest::{self, Entry, Header, RowGroupSeal};
use crate::schema::{self, ValueEncoding};
use crate::seal::{self, Keys};

/// Rows handed to a column writer at once (bounds the temporary per-row series columns).
const WRITE_BATCH: usize = 8192;

/// Writes a points file: rows are pushed sorted by series, then point identity; every
/// `row_group_rows` rows become a row group, whose bytes [`PointsWriter::take_output`] then
/// returns.
pub struct PointsWriter {
    /// Created with the first row group, whose values pick the value encoding.
    file: Option<(SerializedFileWriter<Vec<u8>>, ValueEncoding)>,
    row_group_rows: usize,
    /// (series key, series id) of each series pushed so far.
    series: Vec<(ByteArray, i64)>,
    /// The buffered row group: runs of (series index, rows), then the point columns.
    runs: Vec<(u32, usize)>,
    ts: Vec<i64>,
    values: Vec<f64>,
    events: Vec<i64>,
    rows: u64,
}

impl std::fmt::Debug for PointsWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PointsWriter").field("rows", &self.rows).field("buffered", &self.ts.len()).finish()
    }
}

impl PointsWriter {
    /// A writer whose row groups hold `row_group_rows` rows (at least 1).
    pub fn new(row_group_rows: usize) -> PointsWriter {
        let row_group_rows = row_group_rows.max(1);
        PointsWriter {
            file: None,
            row_group_rows,
            series: Vec::new(),
            runs: Vec::new(),
            ts: Vec::with_capacity(row_group_rows.min(1 << 20)),
            values: Vec::with_capacity(row_group_rows.min(1 << 20)),
            events: Vec::with_capacity(row_group_rows.min(1 << 20)),
            rows: 0,
        }
    }

    /// How the file encodes values, once the first row group chose it.
    pub fn value_encoding(&self) -> Option<ValueEncoding> {
        self.file.as_ref().map(|f| f.1)
    }

    /// Rows pushed so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Bytes of the file produced so far (drained or not).
    pub fn bytes_written(&self) -> usize {
        self.file.as_ref().map_or(0, |f| f.0.bytes_written())
    }

    /// Starts the rows of `series` (after every series pushed before, in key order); returns
    /// its index for [`PointsWriter::push`].
    pub fn begin_series(&mut self, series: &SeriesKey) -> u32 {
        self.series.push((ByteArray::from(series.as_str()), schema::series_id(series) as i64));
        (self.series.len() - 1) as u32
    }

    /// Appends `points` of series `series` (an index from [`PointsWriter::begin_series`]).
    pub fn push(&mut self, series: u32, points: &[Point]) -> Result<(), ParquetError> {
        let mut rest = points;
        while !rest.is_empty() {
            let room = self.row_group_rows - self.ts.len();
            let (now, later) = rest.split_at(room.min(rest.len()));
            match self.runs.last_mut() {
                Some((s, n)) if *s == series => *n += now.len(),
                _ => self.runs.push((series, now.len())),
            }
            for p in now {
                self.ts.push(p.ts);
                self.values.push(p.value);
                self.events.push(p.event as i64);
            }
            self.rows += now.len() as u64;
            if self.ts.len() >= self.row_group_rows {
                self.flush_row_group()?;
            }
            rest = later;
        }
        Ok(())
    }

    /// Bytes encoded since the last call (whole row groups, and the footer after
    /// [`PointsWriter::finish`]).
    pub fn take_output(&mut self) -> Bytes {
        match &mut self.file {
            Some((f, _)) => Bytes::from(std::mem::take(f.inner_mut())),
            None => Bytes::new(),
        }
    }

    fn flush_row_group(&mut self) -> Result<(), ParquetError> {
        if self.ts.is_empty() {
            return Ok(());
        }
        let (runs, series) = (&self.runs, &self.series);
        let (ts, values, events) = (&self.ts, &self.values, &self.events);
        let file = open_file(&mut self.file, values)?;
        let mut rg = file.next_row_group()?;
        let mut column = 0;
        while let Some(mut col) = rg.next_column()? {
            match (column, col.untyped()) {
                (schema::points::SERIES_KEY, ColumnWriter::ByteArrayColumnWriter(w)) => {
                    // One batch of copies of the key per run, written as often as the run is
                    // long: cloning the key (an atomic count) for every row cost 5 % of an export.
                    for &(s, n) in runs {
                        let batch = vec![series[s as usize].0.clone(); n.min(WRITE_BATCH)];
                        let mut left = n;
                        while left > 0 {
                            let k = left.min(batch.len());
                            w.write_batch(&batch[..k], None, None)?;
                            left -= k;
                        }
                    }
                }
                (schema::points::SERIES_ID, ColumnWriter::Int64ColumnWriter(w)) => {
                    let mut batch = Vec::with_capacity(WRITE_BATCH);
                    for &(s, n) in runs {
                        for _ in 0..n {
                            batch.push(series[s as usize].1);
                            if batch.len() == WRITE_BATCH {
                                w.write_batch(&batch, None, None)?;
                                batch.clear();
                            }
                        }
                    }
                    w.write_batch(&batch, None, None)?;
                }
                (schema::points::TIMESTAMP, ColumnWriter::Int64ColumnWriter(w)) => {
                    w.write_batch(ts, None, None)?;
                }
                (schema::points::VALUE, ColumnWriter::DoubleColumnWriter(w)) => {
                    w.write_batch(values, None, None)?;
                }
                (schema::points::EVENT_ID, ColumnWriter::Int64ColumnWriter(w)) => {
                    w.write_batch(events, None, None)?;
                }
                _ => return Err(ParquetError::General(format!("unexpected column {column} in the points schema"))),
            }
            col.close()?;
            column += 1;
        }
        rg.close()?;
        file.flush()?;
        self.runs.clear();
        self.ts.clear();
        self.values.clear();
        self.events.clear();
        Ok(())
    }

    /// Writes the last row group and the footer; [`PointsWriter::take_output`] then returns the
    /// rest of the file.
    pub fn finish(&mut self) -> Result<ParquetMetaData, ParquetError> {
        self.flush_row_group()?;
        let file = open_file(&mut self.file, &[])?;
        let meta = file.finish()?;
        file.flush()?;
        Ok(meta)
    }
}

/// The file writer of `slot`, created first if need be with the value encoding that suits
/// `values` (the first row group's).
fn open_file<'a>(
    slot: &'a mut Option<(SerializedFileWriter<Vec<u8>>, ValueEncoding)>,
    values: &[f64],
) -> Result<&'a mut SerializedFileWriter<Vec<u8>>, ParquetError> {
    if slot.is_none() {
        let encoding = ValueEncoding::choose(values);
        let props = Arc::new(schema::points_properties(encoding));
        *slot = Some((SerializedFileWriter::new(Vec::new(), schema::points_schema(), props)?, encoding));
    }
    Ok(&mut slot.as_mut().expect("just created").0)
}

/// Encodes a manifest: one row per block part, sorted by series then quantum, and the header
/// as the key-value metadata `timeshard.manifest`, with the row groups' chunks and hashes
/// (see [`crate::manifest`]); sealed with `keys` when given (`timeshard.manifest.seal`).
/// Row groups are a page long, so a reader checks and decodes no more than a page's rows.
pub fn encode_manifest(header: &Header, entries: &[Entry], keys: Option<&Keys>) -> Result<Bytes, ParquetError> {
    use schema::manifest as m;
    let props = Arc::new(schema::manifest_properties());
    let mut file = SerializedFileWriter::new(Vec::new(), schema::manifest_schema(), props)?;
    let mut groups = Vec::new();
    for chunk in entries.chunks(schema::PAGE_ROWS) {
        let mut rg = file.next_row_group()?;
        let mut column = 0;
        while let Some(mut col) = rg.next_column()? {
            let i64s = |f: &dyn Fn(&Entry) -> i64| chunk.iter().map(f).collect::<Vec<i64>>();
            let f64s = |f: &dyn Fn(&Entry) -> f64| chunk.iter().map(f).collect::<Vec<f64>>();
            match col.untyped() {
                ColumnWriter::ByteArrayColumnWriter(w) => {
                    let keys: Vec<ByteArray> = chunk.iter().map(|e| ByteArray::from(e.series.as_str())).collect();
                    w.write_batch(&keys, None, None)?;
                }
                ColumnWriter::Int64ColumnWriter(w) => {
                    let v = match column {
                        m::QUANTUM_START => i64s(&|e| e.quantum.start),
                        m::QUANTUM_NS => i64s(&|e| e.quantum.len.ns()),
                        m::ROW_START => i64s(&|e| e.row_start as i64),
                        m::ROWS => i64s(&|e| e.summary.count as i64),
                        m::FIRST_TS => i64s(&|e| e.summary.first.ts),
                        m::FIRST_EVENT => i64s(&|e| e.summary.first.event as i64),
                        m::LAST_TS => i64s(&|e| e.summary.last.ts),
                        m::LAST_EVENT => i64s(&|e| e.summary.last.event as i64),
                        m::DIGEST => i64s(&|e| e.summary.digest as i64),
                        m::COVERS => i64s(&|e| e.covers as i64),
                        m::BASE => i64s(&|e| e.base as i64),
                        _ => return Err(ParquetError::General(format!("unexpected int64 column {column}"))),
                    };
                    w.write_batch(&v, None, None)?;
                }
                ColumnWriter::DoubleColumnWriter(w) => {
                    let v = match column {
                        m::MIN => f64s(&|e| e.summary.min),
                        m::MAX => f64s(&|e| e.summary.max),
                        m::SUM => f64s(&|e| e.summary.sum),
                        m::FIRST_VALUE => f64s(&|e| e.summary.first.value),
                        m::LAST_VALUE => f64s(&|e| e.summary.last.value),
                        _ => return Err(ParquetError::General(format!("unexpected double column {column}"))),
                    };
                    w.write_batch(&v, None, None)?;
                }
                _ => return Err(ParquetError::General(format!("unexpected column {column} in the manifest schema"))),
            }
            col.close()?;
            column += 1;
        }
        let meta = rg.close()?;
        groups.push(RowGroupSeal { chunks: manifest::chunk_ranges(&meta), sha256: String::new() });
    }
    let written = file.inner();
    for g in &mut groups {
        let range = g.range().ok_or_else(|| ParquetError::General("a row group's chunks overflow".into()))?;
        let bytes = written
            .get(range.start as usize..range.end as usize)
            .ok_or_else(|| ParquetError::General("a row group lies beyond what was written".into()))?;
        g.sha256 = seal::sha256(bytes);
    }
    let header = Header { row_groups: groups, ..header.clone() };
    let json = serde_json::to_string(&header).map_err(|e| ParquetError::General(e.to_string()))?;
    if let Some(keys) = keys {
        let seal = keys.seal(&manifest::sealed_bytes(&json)).map_err(|e| ParquetError::General(e.to_string()))?;
        let seal = serde_json::to_string(&seal).map_err(|e| ParquetError::General(e.to_string()))?;
        file.append_key_value_metadata(KeyValue::new(manifest::SEAL_KEY.to_string(), seal));
    }
    file.append_key_value_metadata(KeyValue::new(manifest::HEADER_KEY.to_string(), json));
    Ok(Bytes::from(file.into_inner()?))
}
