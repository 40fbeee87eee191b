//! The exporter: blocks of the hot store to points files and manifests, exactly once.
//!
//! # Implementation notes
//!
//! - Names. A class-day's exports by node `n` are numbered 1, 2, ... in the order they commit;
//!   the next number is one past the highest committed manifest of `n` in that partition, as
//!   listed when the export starts (in its own folder: `node=<n>/`). A run that crashes before its manifest is written leaves a
//!   points file nobody reads; the re-run lists the same manifests, takes the same number, and
//!   overwrites that file. Hence one exporter per node name (the handle serializes its exports).
//! - What to write. A block whose hot digest a committed part (of any node) already covers is confirmed
//!   without writing. Otherwise its hot points are written, less those the archive already
//!   holds for the block (late data after an earlier export), with the digest of the archived
//!   points as the part's `base` and the digest of every hot point read as `covers`.
//! - Order of operations: points file (streamed, a part per `part_bytes`), read back and
//!   checked against the digests computed while writing (`verify`), then the manifest. Only a
//!   committed manifest makes a block confirmed.
//! - Memory: one row group of points (`row_group_rows`), the encoded bytes of one part, and two
//!   row groups' bytes in the channel between the encoding task and the uploader.
//! - Threads. The encoding task awaits what is I/O (the archived rows a block is diffed
//!   against, room in the channel) and hands what blocks (reading the hot block, encoding) to
//!   [`timeshard_clock::spawn_blocking`] a stretch at a time, moving the writer in and back out:
//!   the blocking pool on a node, the runtime's own thread under the simulator, where nothing
//!   may block it.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use object_store::{MultipartUpload, ObjectStoreExt, PutPayload};
use parquet::data_type::{DoubleType, Int64Type};
use timeshard_clock::now_ns;
use timeshard_proto::point::{set_digest, sort_dedup};
use timeshard_proto::{Point, PointKey, Quantum, SeriesClass, SeriesKey};
use timeshard_store::{Store, StoreError, Summary};
use tokio::sync::mpsc;

use crate::catalog::ArchivedBlock;
use crate::error::Error;
use crate::layout::{self, Day, FileId, Kind};
use crate::manifest::{self, Entry, Header};
use crate::query::Batch;
use crate::read::{ParquetFile, Span};
use crate::retry::retry;
use crate::schema::{self, points as col};
use crate::write::{self, PointsWriter};
use crate::{Archive, LastExport};

/// Settings of the exporter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportConfig {
    /// Rows per row group: what the exporter holds in memory (about 24 bytes a row) and the
    /// unit readers skip by with row-group statistics.
    pub row_group_rows: usize,
    /// A points file is closed after the block that reaches this many rows; the rest of the
    /// class-day goes to the next file.
    pub max_file_rows: u64,
    /// Bytes per part of a multipart upload (S3 needs at least 5 MiB); a smaller file is
    /// uploaded with one request.
    pub part_bytes: usize,
    /// Upload rate limit in bytes per second; `None` for none.
    pub rate_limit_bytes_per_s: Option<u64>,
    /// Read each points file back before committing it and check every block's digest.
    pub verify: bool,
    /// Points per read of a hot block.
    pub read_page_points: usize,
}

impl Default for ExportConfig {
    fn default() -> Self {
        ExportConfig {
            row_group_rows: 1 << 20,
            max_file_rows: 1 << 28,
            part_bytes: 16 << 20,
            rate_limit_bytes_per_s: None,
            verify: true,
            read_page_points: 1 << 16,
        }
    }
}

/// A hot block the archive now holds every point of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Confirmed {
    pub series: SeriesKey,
    pub quantum: Quantum,
    /// Digest of the hot block as the exporter read it: drop hot copies only if they still
    /// have it ([`Store::drop_block`] checks).
    pub digest: u64,
    /// The archive held it before this export (nothing was written for it).
    pub already: bool,
}

/// What an export did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExportReport {
    /// Blocks the archive now covers.
    pub confirmed: Vec<Confirmed>,
    /// Blocks asked for that the hot store does not hold (nothing to export).
    pub missing: Vec<(SeriesKey, Quantum)>,
    /// Blocks the hot store cannot read (damaged), with why: left out of the export, so that
    /// they do not hold back the blocks after them, and kept hot.
    pub unreadable: Vec<(SeriesKey, Quantum, String)>,
    /// Exports committed, in order.
    pub files: Vec<FileId>,
    /// Rows and bytes of the points files written.
    pub rows: u64,
    pub bytes: u64,
    /// Attempts at writing a file that failed and were retried.
    pub retries: u32,
}

/// A block to write, with what the archive already holds of it.
#[derive(Clone, Debug)]
struct Job {
    series: SeriesKey,
    quantum: Quantum,
    prior: Option<ArchivedBlock>,
    /// When a write last added points to the hot block ([`timeshard_store::BlockInfo`]).
    last_write: i64,
}

/// What the encoding task produced for one file.
#[derive(Debug, Default)]
struct Encoded {
    entries: Vec<Entry>,
    missing: Vec<(SeriesKey, Quantum)>,
    unreadable: Vec<(SeriesKey, Quantum, String)>,
    /// Jobs taken (written or found missing).
    consumed: usize,
    rows: u64,
    encoding: &'static str,
}

impl Archive {
    /// Exports blocks (`series`, `quantum`) of class `class` from `hot` to the archive, and
    /// reports which the archive now covers. Blocks must use the class's quantum. Safe to
    /// repeat after any failure or crash: blocks already covered are confirmed without writing,
    /// and no block is written twice. Never changes `hot`.
    ///
    /// Export whole days where possible (each call writes one file per class-day it touches).
    /// On error, the blocks of files committed before it stay archived ([`Archive::confirmed`]
    /// tells), and the error is kept for [`Archive::status`].
    pub async fn export(
        &self,
        hot: Arc<dyn Store>,
        class: &SeriesClass,
        blocks: Vec<(SeriesKey, Quantum)>,
    ) -> Result<ExportReport, Error> {
        layout::check_class(&class.name)?;
        if let Some((s, q)) = blocks.iter().find(|(_, q)| q.len != class.quantum) {
            return Err(Error::InvalidInput(format!(
                "block {s} at {} has quanta of {} ns but class {} uses {} ns",
                q.start,
                q.len.ns(),
                class.name,
                class.quantum.ns()
            )));
        }
        let _one_at_a_time = self.inner.export_lock.lock().await;
        let started = now_ns();
        let mut report = ExportReport::default();
        let mut by_day: BTreeMap<Day, Vec<(SeriesKey, Quantum)>> = BTreeMap::new();
        for (s, q) in blocks {
            by_day.entry(Day::of(q.start)).or_default().push((s, q));
        }
        let mut result = Ok(());
        for (day, mut blocks) in by_day {
            blocks.sort_by(|a, b| (&a.0, a.1.start).cmp(&(&b.0, b.1.start)));
            blocks.dedup();
            result = self.export_day(&hot, class, day, blocks, &mut report).await;
            if result.is_err() {
                break;
            }
        }
        let last = LastExport {
            started_ns: started,
            finished_ns: now_ns(),
            class: class.name.clone(),
            files: report.files.len(),
            rows: report.rows,
            bytes: report.bytes,
            confirmed: report.confirmed.len(),
            retries: report.retries,
            error: result.as_ref().err().map(ToString::to_string),
        };
        *self.inner.last_export.lock().unwrap_or_else(|e| e.into_inner()) = Some(last);
        result.map(|()| report)
    }

    async fn export_day(
        &self,
        hot: &Arc<dyn Store>,
        class: &SeriesClass,
        day: Day,
        blocks: Vec<(SeriesKey, Quantum)>,
        report: &mut ExportReport,
    ) -> Result<(), Error> {
        let policy = &self.inner.config.retry;
        let catalog = &self.inner.catalog;
        let ids = retry(policy, "listing manifests", || catalog.manifests_now(&class.name, day)).await?;
        let node = &self.inner.config.node;
        let mut seq = ids.iter().filter(|id| &id.node == node && !id.legacy).map(|id| id.seq).max().unwrap_or(0) + 1;
        let mut jobs = Vec::new();
        let mut archived: Option<(SeriesKey, Arc<Vec<ArchivedBlock>>)> = None;
        for (series, quantum) in blocks {
            if archived.as_ref().is_none_or(|(s, _)| *s != series) {
                let blocks =
                    retry(policy, "reading manifests", || catalog.blocks(&class.name, day, &series, &ids)).await?;
                archived = Some((series.clone(), blocks));
            }
            let list = &archived.as_ref().expect("set above").1;
            let prior = list.binary_search_by_key(&quantum.start, |b| b.quantum.start).ok().map(|i| list[i].clone());
            let Some(info) = hot.block_info(&series, quantum.start)? else {
                report.missing.push((series, quantum));
                continue;
            };
            if prior.as_ref().is_some_and(|b| b.covers(info.digest)) {
                report.confirmed.push(Confirmed { series, quantum, digest: info.digest, already: true });
                continue;
            }
            jobs.push(Job { series, quantum, prior, last_write: info.last_write });
        }
        let mut next = 0;
        while next < jobs.len() {
            let id = FileId { class: class.name.clone(), day, node: node.clone(), seq, legacy: false };
            let encoded = self.write_file(hot, &id, &jobs[next..], report).await?;
            next += encoded.consumed.max(1);
            report.missing.extend(encoded.missing);
            report.unreadable.extend(encoded.unreadable);
            if encoded.entries.is_empty() {
                continue;
            }
            for e in encoded.entries {
                report.confirmed.push(Confirmed {
                    series: e.series,
                    quantum: e.quantum,
                    digest: e.covers,
                    already: false,
                });
            }
            report.files.push(id);
            seq += 1;
        }
        Ok(())
    }

    /// Writes and commits one file from the head of `jobs`, retrying failed attempts.
    async fn write_file(
        &self,
        hot: &Arc<dyn Store>,
        id: &FileId,
        jobs: &[Job],
        report: &mut ExportReport,
    ) -> Result<Encoded, Error> {
        let policy = &self.inner.config.retry;
        let mut attempt = 1;
        loop {
            match self.try_write_file(hot, id, jobs).await {
                Ok((encoded, bytes)) => {
                    report.rows += encoded.rows;
                    report.bytes += bytes;
                    return Ok(encoded);
                }
                Err(e) if e.is_transient() && attempt < policy.attempts.max(1) => {
                    let wait = policy.backoff(attempt);
                    tracing::warn!(file = %id, attempt, wait_ms = wait.as_millis() as u64, error = %e, "export failed; retrying");
                    report.retries += 1;
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One attempt: encode in a task of its own while uploading here, verify, commit.
    async fn try_write_file(&self, hot: &Arc<dyn Store>, id: &FileId, jobs: &[Job]) -> Result<(Encoded, u64), Error> {
        let cfg = &self.inner.config.export;
        let path = id.path(Kind::Points);
        let (tx, mut rx) = mpsc::channel::<Bytes>(2);
        let encoder = tokio::spawn(self.clone().encode(Arc::clone(hot), jobs.into(), tx));
        let mut upload: Option<Box<dyn MultipartUpload>> = None;
        let uploaded: Result<(BytesMut, u64), Error> = async {
            let mut buf = BytesMut::new();
            let mut total = 0u64;
            while let Some(chunk) = rx.recv().await {
                total += chunk.len() as u64;
                buf.extend_from_slice(&chunk);
                while buf.len() >= cfg.part_bytes.max(1) {
                    let part = buf.split_to(cfg.part_bytes.max(1)).freeze();
                    if upload.is_none() {
                        upload = Some(self.store().put_multipart(&path).await.map_err(Error::store("upload", &path))?);
                    }
                    self.inner.rate.acquire(part.len()).await;
                    let up = upload.as_mut().expect("started above");
                    up.put_part(PutPayload::from(part)).await.map_err(Error::store("upload", &path))?;
                }
            }
            Ok((buf, total))
        }
        .await;
        drop(rx);
        let encoded = encoder.await.map_err(|e| Error::Internal(format!("encoding task failed: {e}")));
        let finished = match (uploaded, encoded) {
            (Ok((rest, total)), Ok(Ok(encoded))) => {
                self.finish_upload(&path, &mut upload, rest, &encoded).await.map(|()| (encoded, total))
            }
            (Err(e), _) | (_, Ok(Err(e))) | (_, Err(e)) => Err(e),
        };
        let (encoded, total) = match finished {
            Ok(done) => done,
            Err(e) => {
                if let Some(mut up) = upload {
                    let _ = up.abort().await;
                }
                return Err(e);
            }
        };
        if encoded.entries.is_empty() {
            return Ok((encoded, 0));
        }
        if cfg.verify {
            self.verify(&path, &encoded, total).await?;
        }
        let header = Header {
            format: manifest::FORMAT_VERSION,
            class: id.class.clone(),
            day: id.day.to_string(),
            node: id.node.clone(),
            seq: id.seq,
            points_file: path.to_string(),
            points_bytes: total,
            points_rows: encoded.rows,
            blocks: encoded.entries.len() as u64,
            created_ns: now_ns(),
            value_encoding: encoded.encoding.to_string(),
            written_ns: jobs[..encoded.consumed.min(jobs.len())].iter().map(|j| j.last_write).max(),
            row_groups: Vec::new(),
        };
        let bytes = write::encode_manifest(&header, &encoded.entries, self.inner.config.keys.as_deref())
            .map_err(|e| Error::Internal(format!("encoding the manifest of {id}: {e}")))?;
        let manifest_path = id.path(Kind::Manifest);
        let policy = &self.inner.config.retry;
        retry(policy, "committing a manifest", || async {
            self.store()
                .put(&manifest_path, PutPayload::from(bytes.clone()))
                .await
                .map_err(Error::store("write", &manifest_path))
        })
        .await?;
        self.inner.catalog.forget(id);
        self.inner.catalog.note_committed(id);
        tracing::info!(file = %id, rows = encoded.rows, bytes = total, blocks = encoded.entries.len(), "export committed");
        Ok((encoded, total))
    }

    /// Sends the last bytes of a points file and completes its upload (nothing is written for
    /// a file without rows).
    async fn finish_upload(
        &self,
        path: &object_store::path::Path,
        upload: &mut Option<Box<dyn MultipartUpload>>,
        rest: BytesMut,
        encoded: &Encoded,
    ) -> Result<(), Error> {
        if encoded.entries.is_empty() {
            if let Some(mut up) = upload.take() {
                let _ = up.abort().await;
            }
            return Ok(());
        }
        self.inner.rate.acquire(rest.len()).await;
        match upload {
            Some(up) => {
                if !rest.is_empty() {
                    up.put_part(PutPayload::from(rest.freeze())).await.map_err(Error::store("upload", path))?;
                }
                up.complete().await.map_err(Error::store("upload", path))?;
                *upload = None;
            }
            None => {
                self.store().put(path, PutPayload::from(rest.freeze())).await.map_err(Error::store("upload", path))?;
            }
        }
        Ok(())
    }

    /// The encoding task: reads each job's block from `hot`, writes the points the archive
    /// lacks, and sends the file's bytes a row group at a time.
    async fn encode(self, hot: Arc<dyn Store>, jobs: Arc<[Job]>, tx: mpsc::Sender<Bytes>) -> Result<Encoded, Error> {
        let mut encoder = Encoder::new(&self.inner.config.export);
        let mut prior = None;
        loop {
            let (hot, jobs, loaded) = (Arc::clone(&hot), Arc::clone(&jobs), prior.take());
            let (back, step) = timeshard_clock::spawn_blocking(move || {
                let step = encoder.advance(&*hot, &jobs, loaded);
                (encoder, step)
            })
            .await
            .map_err(|e| Error::Internal(format!("encoding task failed: {e}")))?;
            encoder = back;
            match step? {
                Step::Output(bytes) => send(&tx, bytes).await?,
                Step::NeedsPrior(block) => prior = Some(self.load(&Batch::Merged(&block), i64::MIN).await?),
                Step::Finished(bytes) => {
                    send(&tx, bytes).await?;
                    return Ok(encoder.out);
                }
            }
        }
    }

    /// Reads the uploaded points file back and checks its size, rows, and every block's
    /// series and digest against what was written. Series are checked by their id column row
    /// by row, and by the key column's statistics (its first and last key) per row group:
    /// decoding every key would cost a tenth of the export.
    async fn verify(&self, path: &object_store::path::Path, encoded: &Encoded, bytes: u64) -> Result<(), Error> {
        let mismatch = |d: String| Error::Mismatch { path: path.to_string(), detail: d };
        let pf = ParquetFile::open(&**self.store(), path).await.map_err(|e| mismatch(e.to_string()))?;
        if pf.size != bytes || pf.rows() != encoded.rows {
            return Err(mismatch(format!(
                "{} bytes and {} rows instead of {bytes} and {}",
                pf.size,
                pf.rows(),
                encoded.rows
            )));
        }
        // A Vec, not a lazy filter: an iterator adapter's closure held across the awaits below
        // makes the export future not `Send` for callers that spawn it.
        let with_rows: Vec<(&Entry, i64)> = encoded
            .entries
            .iter()
            .filter(|e| e.summary.count > 0)
            .map(|e| (e, schema::series_id(&e.series) as i64))
            .collect();
        let mut entries = with_rows.into_iter().peekable();
        let mut digest = 0u64;
        let mut row = 0u64;
        for rg in 0..pf.meta.num_row_groups() {
            let n = pf.meta.row_group(rg).num_rows().max(0) as usize;
            let span = Span { rg, start: 0, end: n };
            let cols = [col::SERIES_ID, col::TIMESTAMP, col::VALUE, col::EVENT_ID];
            let pages = pf.fetch(&**self.store(), &span, &cols).await?;
            let ids = pf.decode::<Int64Type>(&pages, &span, col::SERIES_ID)?;
            let ts = pf.decode::<Int64Type>(&pages, &span, col::TIMESTAMP)?;
            let values = pf.decode::<DoubleType>(&pages, &span, col::VALUE)?;
            let events = pf.decode::<Int64Type>(&pages, &span, col::EVENT_ID)?;
            let (mut first, mut last): (Option<&SeriesKey>, Option<&SeriesKey>) = (None, None);
            for i in 0..n {
                let Some((e, id)) = entries.peek() else {
                    return Err(mismatch(format!("row {row} belongs to no block")));
                };
                if ids[i] != *id {
                    return Err(mismatch(format!("row {row} is not of series {}", e.series)));
                }
                first.get_or_insert(&e.series);
                last = Some(&e.series);
                digest =
                    digest.wrapping_add(Point { ts: ts[i], value: values[i], event: events[i] as u64 }.identity_hash());
                row += 1;
                if row == e.row_start + e.summary.count {
                    if digest != e.summary.digest {
                        return Err(mismatch(format!("block {} at {} has another digest", e.series, e.quantum.start)));
                    }
                    digest = 0;
                    entries.next();
                }
            }
            let stats = pf.meta.row_group(rg).column(col::SERIES_KEY).statistics();
            let bounds = stats.and_then(|s| Some((s.min_bytes_opt()?, s.max_bytes_opt()?)));
            let want = first.zip(last).map(|(f, l)| (f.as_str().as_bytes(), l.as_str().as_bytes()));
            if n > 0 && bounds != want {
                return Err(mismatch(format!("row group {rg} has other series keys than written")));
            }
        }
        match entries.next() {
            Some((e, _)) => Err(mismatch(format!("block {} at {} is missing", e.series, e.quantum.start))),
            None => Ok(()),
        }
    }
}

/// Sends `bytes` of a points file on to the uploader (none: nothing).
async fn send(tx: &mpsc::Sender<Bytes>, bytes: Bytes) -> Result<(), Error> {
    if bytes.is_empty() {
        return Ok(());
    }
    tx.send(bytes).await.map_err(|_| Error::Internal("the upload stopped".into()))
}

/// Where [`Encoder::advance`] stopped, and what its caller is to do before calling it again.
#[derive(Debug)]
enum Step {
    /// Bytes of the file (whole row groups) to send on.
    Output(Bytes),
    /// The next job's block has archived rows: load them (unsorted is fine) and pass them in.
    NeedsPrior(ArchivedBlock),
    /// The file is complete; its last bytes. [`Encoder::out`] holds what it contains.
    Finished(Bytes),
}

/// The blocking half of encoding one file: the writer, and how far through the jobs it is.
/// It moves into blocking work and back out at every [`Step`].
#[derive(Debug)]
struct Encoder {
    w: PointsWriter,
    out: Encoded,
    max_file_rows: u64,
    read_page_points: usize,
    /// The series being written, and its index in the writer.
    current: Option<(SeriesKey, u32)>,
    /// The next job to start.
    next: usize,
    /// The job whose block is being read, between pages.
    block: Option<BlockInProgress>,
}

/// A job whose block is being read page by page.
#[derive(Debug)]
struct BlockInProgress {
    job: usize,
    series: u32,
    /// The points the archive holds of the block, sorted.
    prior: Vec<Point>,
    row_start: u64,
    summary: SummaryBuilder,
    /// Digest of the hot points read.
    covers: u64,
    /// Hot points read.
    seen: usize,
    /// The last point read, when more follow.
    after: Option<PointKey>,
}

impl Encoder {
    fn new(cfg: &ExportConfig) -> Encoder {
        Encoder {
            w: PointsWriter::new(cfg.row_group_rows),
            out: Encoded::default(),
            max_file_rows: cfg.max_file_rows,
            read_page_points: cfg.read_page_points.max(1),
            current: None,
            next: 0,
            block: None,
        }
    }

    /// Reads and encodes pages of the jobs' blocks until the writer has bytes to send, the next
    /// job needs its block's archived rows (the caller loads them and passes them as `prior`),
    /// or the file is complete.
    fn advance(&mut self, hot: &dyn Store, jobs: &[Job], mut prior: Option<Vec<Point>>) -> Result<Step, Error> {
        let parquet = |e: parquet::errors::ParquetError| Error::Internal(format!("encoding a points file: {e}"));
        loop {
            let mut block = match self.block.take() {
                Some(block) => block,
                None if self.next == jobs.len() || self.w.rows() >= self.max_file_rows => {
                    self.w.finish().map_err(parquet)?;
                    self.out.rows = self.w.rows();
                    self.out.encoding =
                        self.w.value_encoding().map_or("byte_stream_split", schema::ValueEncoding::name);
                    return Ok(Step::Finished(self.w.take_output()));
                }
                None => {
                    let prior = match &jobs[self.next].prior {
                        Some(b) if b.rows() > 0 => match prior.take() {
                            Some(mut p) => {
                                sort_dedup(&mut p);
                                p
                            }
                            None => return Ok(Step::NeedsPrior(b.clone())),
                        },
                        _ => Vec::new(),
                    };
                    self.start(jobs, prior)
                }
            };
            let job = &jobs[block.job];
            let page = match hot.read_block(&job.series, job.quantum.start, block.after, self.read_page_points) {
                Ok(page) => page,
                // Damage found before any of the block was written: leave it out (it stays
                // hot, and the caller reports it) rather than fail every later round on it.
                Err(StoreError::Corrupt(why)) if block.after.is_none() => {
                    self.out.unreadable.push((job.series.clone(), job.quantum, why));
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let last = page.points.last().map(Point::key);
            block.seen += page.points.len();
            block.covers = block.covers.wrapping_add(set_digest(&page.points));
            let fresh: Vec<Point> = if block.prior.is_empty() {
                page.points
            } else {
                page.points.into_iter().filter(|p| block.prior.binary_search(p).is_err()).collect()
            };
            block.summary.add(&fresh);
            self.w.push(block.series, &fresh).map_err(parquet)?;
            let bytes = self.w.take_output();
            match (page.more, last) {
                (true, Some(last)) => {
                    block.after = Some(last);
                    self.block = Some(block);
                }
                _ => self.end(job, block),
            }
            if !bytes.is_empty() {
                return Ok(Step::Output(bytes));
            }
        }
    }

    /// Takes the next job, whose block's archived points are `prior` (sorted).
    fn start(&mut self, jobs: &[Job], prior: Vec<Point>) -> BlockInProgress {
        let job = &jobs[self.next];
        let series = match &self.current {
            Some((s, i)) if *s == job.series => *i,
            _ => {
                let i = self.w.begin_series(&job.series);
                self.current = Some((job.series.clone(), i));
                i
            }
        };
        let block = BlockInProgress {
            job: self.next,
            series,
            prior,
            row_start: self.w.rows(),
            summary: SummaryBuilder::default(),
            covers: 0,
            seen: 0,
            after: None,
        };
        self.out.consumed += 1;
        self.next += 1;
        block
    }

    /// Records the block of `job`, read to its end.
    fn end(&mut self, job: &Job, block: BlockInProgress) {
        if block.seen == 0 {
            self.out.missing.push((job.series.clone(), job.quantum));
            return;
        }
        self.out.entries.push(Entry {
            series: job.series.clone(),
            quantum: job.quantum,
            row_start: block.row_start,
            summary: block.summary.finish(),
            covers: block.covers,
            base: set_digest(&block.prior),
        });
    }
}

/// [`Summary::of`] over points fed in identity order, a page at a time (the same sums in the
/// same order, so the result is bit-for-bit the hot store's).
#[derive(Debug)]
struct SummaryBuilder {
    count: u64,
    min: f64,
    max: f64,
    sum: f64,
    first: Option<Point>,
    last: Option<Point>,
    digest: u64,
}

impl Default for SummaryBuilder {
    fn default() -> Self {
        SummaryBuilder { count: 0, min: f64::NAN, max: f64::NAN, sum: 0.0, first: None, last: None, digest: 0 }
    }
}

impl SummaryBuilder {
    fn add(&mut self, points: &[Point]) {
        for p in points {
            self.min = self.min.min(p.value);
            self.max = self.max.max(p.value);
            self.sum += p.value;
            self.digest = self.digest.wrapping_add(p.identity_hash());
        }
        if let (Some(f), Some(l)) = (points.first(), points.last()) {
            self.first.get_or_insert(*f);
            self.last = Some(*l);
        }
        self.count += points.len() as u64;
    }

    fn finish(&self) -> Summary {
        match (self.first, self.last) {
            (Some(first), Some(last)) => Summary {
                count: self.count,
                min: self.min,
                max: self.max,
                sum: self.sum,
                first,
                last,
                digest: self.digest,
            },
            _ => manifest::empty_summary(),
        }
    }
}
