//! Manifests: the commit marker of one export, written after its points file, listing every
//! block part in that file with its summary (FORMAT.md, "Manifests"). A manifest is itself a
//! small Parquet file (one row per block part, sorted like the points) whose key-value metadata
//! `timeshard.manifest` holds the [`Header`] as JSON, and `timeshard.manifest.seal` the
//! exporting node's signature over it ([`crate::seal`]).
//!
//! # What the seal covers
//!
//! The node signs the header's exact bytes. The header names the export (class, day, node,
//! sequence, points file with its size and rows) and lists, per row group, the byte range of
//! every column chunk and the SHA-256 of the row group's bytes ([`RowGroupSeal`]). A reader
//! checks the seal when it opens the manifest, that the footer places every chunk where the
//! header says, and the hash of each row group it fetches before decoding it.
//!
//! Who wrote it and what it is are told apart: a seal that fails (none, another node's, not
//! the fleet's, a changed header, a header naming another export) refuses the manifest
//! ([`Error::Refused`]: skipped, counted, the rest readable), so a node can neither speak for
//! another nor stop others' reads by writing junk in its own folder beyond its own files; a
//! sealed manifest whose bytes then differ from what its header says is damage, and fails the
//! reads that need it naming the file ([`Error::Corrupt`]), like any damaged file, rather than
//! answering without its blocks. The footer
//! itself is not signed; what it could still say differently (row-group statistics) only makes
//! a reader skip or read a row group, never take other bytes. Points files are covered through
//! the manifest: it records their size, rows and every block's digest, which reads check.

use object_store::ObjectStore;
use parquet::data_type::{ByteArrayType, DoubleType, Int64Type};
use serde::{Deserialize, Serialize};
use timeshard_proto::{Point, Quantum, QuantumLen, SeriesKey};
use timeshard_store::Summary;

use crate::error::Error;
use crate::layout::{FileId, Kind};
use crate::read::{Pages, ParquetFile, Span};
use crate::schema::manifest as col;
use crate::seal::{self, Keys, Seal};

/// Key of the header in a manifest's key-value metadata.
pub const HEADER_KEY: &str = "timeshard.manifest";
/// Key of the seal in a manifest's key-value metadata.
pub const SEAL_KEY: &str = "timeshard.manifest.seal";
/// Manifest format this build writes and the newest it reads.
pub const FORMAT_VERSION: u32 = 1;
/// What a node signs for a manifest: this tag, then the header's JSON as stored.
const SEAL_DOMAIN: &[u8] = b"timeshard archive manifest v1\0";
/// Most row groups a sealed header lists (a manifest of 2^13 rows a group: 32 M block parts).
const MAX_SEALED_ROW_GROUPS: usize = 4096;

/// The message a node seals for a header stored as `json`.
pub fn sealed_bytes(json: &str) -> Vec<u8> {
    let mut out = SEAL_DOMAIN.to_vec();
    out.extend_from_slice(json.as_bytes());
    out
}

/// Where one row group of a manifest lies and what its bytes hash to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowGroupSeal {
    /// `[offset, length]` of each column chunk, in column order.
    pub chunks: Vec<[u64; 2]>,
    /// SHA-256 (hex) of the bytes from the first chunk's start to the last chunk's end.
    pub sha256: String,
}

impl RowGroupSeal {
    /// The byte range the hash covers.
    pub fn range(&self) -> Option<std::ops::Range<u64>> {
        let start = self.chunks.iter().map(|c| c[0]).min()?;
        let end =
            self.chunks.iter().map(|c| c[0].checked_add(c[1])).collect::<Option<Vec<u64>>>()?.into_iter().max()?;
        Some(start..end)
    }
}

/// What a manifest says about its export as a whole.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// Manifest format ([`FORMAT_VERSION`]).
    pub format: u32,
    pub class: String,
    /// UTC day of the partition, `YYYY-MM-DD`.
    pub day: String,
    /// The exporting node.
    pub node: String,
    /// The node's export number in this partition.
    pub seq: u64,
    /// Object name of the points file, relative to the archive root.
    pub points_file: String,
    /// Its size in bytes and rows, as written and read back.
    pub points_bytes: u64,
    pub points_rows: u64,
    /// Block parts listed (rows of the manifest).
    pub blocks: u64,
    /// When the export committed, ns since the epoch (the exporting node's clock).
    pub created_ns: i64,
    /// `dictionary` or `byte_stream_split`: how the points file encodes values.
    pub value_encoding: String,
    /// When a write last added points to the newest-written block in the file, ns since the
    /// epoch, as the hot store reported it: what retention by write time ages the file's
    /// points from. Absent in files of earlier builds (then `created_ns` stands in).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_ns: Option<i64>,
    /// Each row group's chunks and hash (see the module docs); empty in files of builds
    /// before seals.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub row_groups: Vec<RowGroupSeal>,
}

impl Header {
    /// The write time retention by write time ages this file's points from.
    pub fn written(&self) -> i64 {
        self.written_ns.unwrap_or(self.created_ns)
    }
}

/// One block part: the rows of block (`series`, `quantum`) in one points file.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub series: SeriesKey,
    pub quantum: Quantum,
    /// First row of the part in the points file; the part is `summary.count` rows long.
    pub row_start: u64,
    /// Summary of the part's rows (count, min, max, sum, first, last, digest). Meaningless
    /// but for `count` (0) and `digest` (0) when the part has no rows.
    pub summary: Summary,
    /// Digest of the hot block this export made the archive hold in full: every point of it
    /// is in this part or in the parts it was diffed against.
    pub covers: u64,
    /// Digest of the archived points of the block this part was diffed against (0 for the
    /// block's first export): the part holds exactly the hot points not among them.
    pub base: u64,
}

/// The summary of an empty part.
pub fn empty_summary() -> Summary {
    let zero = Point::new(0, 0.0);
    Summary { count: 0, min: 0.0, max: 0.0, sum: 0.0, first: zero, last: zero, digest: 0 }
}

/// Checks what a part's summary must satisfy, so that a damaged manifest (a flipped byte) fails
/// naming its file instead of answering window aggregates with a wrong summary: its first and
/// last points lie in the quantum, in order, within `[min, max]`, and the sum within
/// `count × [min, max]`; a part of one point has first = last and min = max = sum = its value.
/// An empty part carries nothing to check. NaN values pass the comparisons they make
/// meaningless.
fn check_summary(quantum: &Quantum, s: &Summary) -> Result<(), String> {
    if s.count == 0 {
        return Ok(());
    }
    let in_quantum = |ts| quantum.start <= ts && ts < quantum.end();
    if !in_quantum(s.first.ts) || !in_quantum(s.last.ts) {
        return Err(format!(
            "first or last point ({}, {}) outside its quantum [{}, {})",
            s.first.ts,
            s.last.ts,
            quantum.start,
            quantum.end()
        ));
    }
    if s.first.ts > s.last.ts {
        return Err(format!("first point at {} after the last at {}", s.first.ts, s.last.ts));
    }
    // `false` only when both are numbers and out of order.
    let le = |a: f64, b: f64| a.partial_cmp(&b) != Some(std::cmp::Ordering::Greater);
    if !le(s.min, s.max) || ![s.first.value, s.last.value].iter().all(|&v| le(s.min, v) && le(v, s.max)) {
        return Err(format!("values out of [min, max] = [{}, {}]", s.min, s.max));
    }
    if s.count == 1 {
        let one = s.first.value.to_bits();
        if s.first != s.last || [s.last.value, s.min, s.max, s.sum].iter().any(|v| v.to_bits() != one) {
            return Err("of one point whose first, last, min, max and sum differ".into());
        }
        return Ok(());
    }
    // A relative tolerance for rounding in the sum of `count` values.
    let n = s.count as f64;
    let slack = (s.min.abs().max(s.max.abs()) * n) * 1e-9;
    if !le(s.min * n - slack, s.sum) || !le(s.sum, s.max * n + slack) {
        return Err(format!("sum {} outside {} x [{}, {}]", s.sum, s.count, s.min, s.max));
    }
    Ok(())
}

/// An opened manifest: its export, header and Parquet metadata.
#[derive(Debug)]
pub struct Manifest {
    pub id: FileId,
    pub header: Header,
    /// Its seal was checked against the fleet CA and its folder's node (false: a legacy
    /// manifest, or a handle without keys).
    pub verified: bool,
    file: ParquetFile,
}

impl Manifest {
    /// Reads and checks the footer and header of `id`'s manifest. With `keys`, a manifest in
    /// a node's folder must carry a seal of that node ([`Error::Refused`] otherwise); a legacy
    /// one is read unverified.
    pub async fn open(store: &dyn ObjectStore, id: &FileId, keys: Option<&Keys>) -> Result<Manifest, Error> {
        let path = id.path(Kind::Manifest);
        let file = ParquetFile::open(store, &path).await?;
        let corrupt = |d: String| Error::corrupt(&path, d);
        let kv = file.meta.file_metadata().key_value_metadata();
        let value = |key: &str| kv.and_then(|kv| kv.iter().find(|k| k.key == key)).and_then(|k| k.value.as_deref());
        let json = value(HEADER_KEY).ok_or_else(|| corrupt(format!("no {HEADER_KEY} header")))?;
        let header: Header = serde_json::from_str(json).map_err(|e| corrupt(format!("bad header: {e}")))?;
        let verified = match keys {
            Some(keys) if !id.legacy => {
                let refused = |reason: String| Error::Refused { path: path.to_string(), reason };
                let seal = value(SEAL_KEY).ok_or_else(|| refused("it carries no seal".into()))?;
                let seal = Seal::parse(seal).map_err(refused)?;
                keys.check(&sealed_bytes(json), &seal, &id.node, header.created_ns).map_err(refused)?;
                true
            }
            _ => false,
        };
        if header.format > FORMAT_VERSION {
            return Err(corrupt(format!(
                "manifest format {} is newer than this build reads ({FORMAT_VERSION}); upgrade timeshard",
                header.format
            )));
        }
        let expected = (id.class.as_str(), id.day.to_string(), id.node.as_str(), id.seq);
        if (header.class.as_str(), header.day.clone(), header.node.as_str(), header.seq) != expected
            || header.points_file != id.path(Kind::Points).as_ref()
        {
            // Sealed by the folder's node but naming another export (another node, say): a
            // node's claim about others is refused like a bad seal.
            let detail = format!("header {header:?} does not match the object name");
            return Err(if verified {
                Error::Refused { path: path.to_string(), reason: detail }
            } else {
                corrupt(detail)
            });
        }
        if file.rows() != header.blocks {
            return Err(corrupt(format!("{} rows but the header lists {} blocks", file.rows(), header.blocks)));
        }
        if verified || !header.row_groups.is_empty() {
            check_layout(&file, &header).map_err(corrupt)?;
        }
        Ok(Manifest { id: id.clone(), header, verified, file })
    }

    /// The bytes of row group `rg`, checked against its hash when the header lists hashes,
    /// as pages to decode.
    async fn row_group(&self, store: &dyn ObjectStore, rg: usize, cols: &[usize]) -> Result<Pages, Error> {
        let Some(sealed) = self.header.row_groups.get(rg) else {
            let rows = self.file.meta.row_group(rg).num_rows().max(0) as usize;
            return self.file.fetch(store, &Span { rg, start: 0, end: rows }, cols).await;
        };
        let path = self.id.path(Kind::Manifest);
        let range = sealed.range().ok_or_else(|| Error::corrupt(&path, "a row group's chunks overflow"))?;
        let (pages, bytes) = self.file.fetch_range(store, range).await?;
        if seal::sha256(&bytes) != sealed.sha256 {
            return Err(Error::corrupt(
                &path,
                format!("row group {rg} does not hash to what its header says (it was changed after writing)"),
            ));
        }
        Ok(pages)
    }

    /// The block parts of `series` (of every series when `None`), sorted by series then quantum.
    pub async fn entries(&self, store: &dyn ObjectStore, series: Option<&SeriesKey>) -> Result<Vec<Entry>, Error> {
        let groups = match series {
            Some(s) => self.file.row_groups_with_key(col::SERIES_KEY, s.as_str()),
            None => (0..self.file.meta.num_row_groups()).map(|rg| (rg, 0)).collect(),
        };
        let mut out = Vec::new();
        for (rg, _) in groups {
            let rows = self.file.meta.row_group(rg).num_rows().max(0) as usize;
            let whole = Span { rg, start: 0, end: rows };
            let all: Vec<usize> = (0..col::NAMES.len()).collect();
            let group = self.row_group(store, rg, &all).await?;
            let keys = self.file.decode::<ByteArrayType>(&group, &whole, col::SERIES_KEY)?;
            let (a, b) = match series {
                Some(s) => {
                    let k = s.as_str().as_bytes();
                    let a = keys.partition_point(|x| x.data() < k);
                    let b = keys.partition_point(|x| x.data() <= k);
                    (a, b)
                }
                None => (0, rows),
            };
            if a == b {
                continue;
            }
            let span = Span { rg, start: a, end: b };
            let pages = &group;
            let i = |c| self.file.decode::<Int64Type>(pages, &span, c);
            let f = |c| self.file.decode::<DoubleType>(pages, &span, c);
            let (qs, qn, rs, rows) = (i(col::QUANTUM_START)?, i(col::QUANTUM_NS)?, i(col::ROW_START)?, i(col::ROWS)?);
            let (min, max, sum) = (f(col::MIN)?, f(col::MAX)?, f(col::SUM)?);
            let (fts, fv, fe) = (i(col::FIRST_TS)?, f(col::FIRST_VALUE)?, i(col::FIRST_EVENT)?);
            let (lts, lv, le) = (i(col::LAST_TS)?, f(col::LAST_VALUE)?, i(col::LAST_EVENT)?);
            let (dg, cv, bs) = (i(col::DIGEST)?, i(col::COVERS)?, i(col::BASE)?);
            let path = self.id.path(Kind::Manifest);
            let mut last_key: Option<SeriesKey> = None;
            for r in 0..b - a {
                let key = std::str::from_utf8(keys[a + r].data()).ok();
                let series = match (&last_key, key) {
                    (Some(k), Some(s)) if k.as_str() == s => k.clone(),
                    (_, Some(s)) => SeriesKey::try_from(s.to_string())
                        .map_err(|e| Error::corrupt(&path, format!("row {}: {e}", a + r)))?,
                    (_, None) => return Err(Error::corrupt(&path, format!("row {}: series key is not UTF-8", a + r))),
                };
                last_key = Some(series.clone());
                let quantum = QuantumLen::new(qn[r])
                    .ok()
                    .and_then(|len| Quantum::at(qs[r], len))
                    .ok_or_else(|| Error::corrupt(&path, format!("row {}: bad quantum {}+{}", a + r, qs[r], qn[r])))?;
                if rows[r] < 0 || rs[r] < 0 || (rs[r] + rows[r]) as u64 > self.header.points_rows {
                    return Err(Error::corrupt(
                        &path,
                        format!("row {}: rows {}+{} out of the points file", a + r, rs[r], rows[r]),
                    ));
                }
                let summary = Summary {
                    count: rows[r] as u64,
                    min: min[r],
                    max: max[r],
                    sum: sum[r],
                    first: Point { ts: fts[r], value: fv[r], event: fe[r] as u64 },
                    last: Point { ts: lts[r], value: lv[r], event: le[r] as u64 },
                    digest: dg[r] as u64,
                };
                check_summary(&quantum, &summary)
                    .map_err(|why| Error::corrupt(&path, format!("row {}: summary {why}", a + r)))?;
                out.push(Entry {
                    series,
                    quantum,
                    row_start: rs[r] as u64,
                    summary,
                    covers: cv[r] as u64,
                    base: bs[r] as u64,
                });
            }
        }
        Ok(out)
    }
}

/// Checks that the footer has the manifest schema and places every column chunk where the
/// sealed header says.
/// Where each column chunk of a row group lies in its file (`[start, length]`): what a seal
/// records of a manifest's row groups and a reader checks before trusting them.
pub fn chunk_ranges(group: &parquet::file::metadata::RowGroupMetaData) -> Vec<[u64; 2]> {
    group
        .columns()
        .iter()
        .map(|c| {
            let (start, len) = c.byte_range();
            [start, len]
        })
        .collect()
}

fn check_layout(file: &ParquetFile, header: &Header) -> Result<(), String> {
    let want = parquet::schema::types::SchemaDescriptor::new(crate::schema::manifest_schema());
    let have = file.meta.file_metadata().schema_descr();
    let same = want.num_columns() == have.num_columns()
        && want
            .columns()
            .iter()
            .zip(have.columns())
            .all(|(a, b)| a.path() == b.path() && a.physical_type() == b.physical_type());
    if !same {
        return Err("its columns are not the manifest schema".into());
    }
    let groups = file.meta.row_groups();
    if header.row_groups.len() != groups.len() || header.row_groups.len() > MAX_SEALED_ROW_GROUPS {
        return Err(format!("the seal lists {} row groups, the file has {}", header.row_groups.len(), groups.len()));
    }
    for (rg, (sealed, group)) in header.row_groups.iter().zip(groups).enumerate() {
        if chunk_ranges(group) != sealed.chunks {
            return Err(format!("row group {rg}'s column chunks are not where the seal places them"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    /// Found by fuzzing (fuzz/regressions/tier_manifest/crash-d7c9… and crash-c902…): pages
    /// that the parquet crate's decoders panic on past every check at open (a delta-encoded page
    /// declaring no values but holding a first one underflows a counter; a bit-packed run
    /// longer than its page trips an assertion in `bit_util`); the panic reached whoever listed
    /// the manifest's entries. Listing is a corrupt-file error naming the manifest now.
    #[test]
    fn manifest_pages_the_parquet_decoders_panic_on_are_a_corrupt_file_error() {
        let inputs: [&'static [u8]; 2] = [
            include_bytes!("../../../fuzz/regressions/tier_manifest/crash-d7c9c80711f15a55b9827ad4f4491c86e6954b25"),
            include_bytes!("../../../fuzz/regressions/tier_manifest/crash-c9027ff0095e665f2ad2d3f4cdc40ade5f449a0a"),
        ];
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        for bytes in inputs {
            runtime.block_on(async {
                let store = object_store::memory::InMemory::new();
                let day = crate::Day::parse("2023-11-14").unwrap();
                let id = FileId { class: "pmu".into(), day, node: "n1".into(), seq: 1, legacy: false };
                object_store::ObjectStoreExt::put(
                    &store,
                    &id.path(Kind::Manifest),
                    bytes::Bytes::from_static(bytes).into(),
                )
                .await
                .unwrap();
                let manifest = Manifest::open(&store, &id, None).await.expect("its header and footer are whole");
                let e = manifest.entries(&store, None).await.expect_err("a damaged page");
                assert!(e.to_string().contains("is corrupt"), "{e}");
            });
        }
    }

    fn quantum() -> Quantum {
        Quantum::at(600 * S, QuantumLen::new(60 * S).unwrap()).unwrap()
    }

    fn summary(points: &[Point]) -> Summary {
        Summary::of(points).unwrap()
    }

    #[test]
    fn summaries_of_real_parts_pass() {
        let q = quantum();
        assert!(check_summary(&q, &summary(&[Point::new(600 * S, 1.5)])).is_ok());
        assert!(
            check_summary(
                &q,
                &summary(&[Point::new(601 * S, -3.0), Point::new(630 * S, 2.0), Point::new(659 * S, 0.1)])
            )
            .is_ok()
        );
        assert!(check_summary(&q, &summary(&[Point::new(601 * S, f64::NAN), Point::new(602 * S, 1.0)])).is_ok());
        assert!(check_summary(&q, &empty_summary()).is_ok());
    }

    /// The hostile-archive test's damage: a flipped byte in a manifest moved a part's last
    /// point out of its quantum, and a single settled node answered windows from that summary.
    #[test]
    fn a_damaged_summary_is_refused() {
        let q = quantum();
        let good = summary(&[Point::new(600 * S, 1.5)]);
        let mut late = good;
        late.last.ts = (600 + 673) * S;
        assert!(check_summary(&q, &late).unwrap_err().contains("outside its quantum"));
        let mut other = good;
        other.sum = 2.5;
        assert!(check_summary(&q, &other).is_err());
        let mut two = summary(&[Point::new(601 * S, 1.0), Point::new(602 * S, 3.0)]);
        two.sum = 1e9;
        assert!(check_summary(&q, &two).unwrap_err().contains("sum"));
        let mut outside = two;
        outside.min = 2.0;
        assert!(check_summary(&q, &outside).is_err());
    }
}
