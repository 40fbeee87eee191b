//! Reading Parquet files on object storage without arrow: the footer and page index once per
//! file (callers cache [`ParquetFile`]), then only the pages that hold the asked rows of the
//! asked columns, fetched in one ranged request per run of pages and decoded with the parquet
//! crate's column readers. Dictionary pages are kept decompressed in a [`DictionaryCache`]:
//! a paged read of a row group would otherwise fetch and decompress the value dictionary
//! (up to 1 MiB) once per page, more than the rows it reads.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt};
use parquet::basic::{Encoding, PageType};
use parquet::column::page::{Page, PageMetadata, PageReader};
use parquet::column::reader::ColumnReaderImpl;
use parquet::data_type::DataType;
use parquet::errors::ParquetError;
use parquet::file::metadata::{ColumnChunkMetaData, PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};
use parquet::file::page_index::column_index::ColumnIndexMetaData;
use parquet::file::page_index::offset_index::PageLocation;
use parquet::file::reader::{ChunkReader, Length};
use parquet::file::serialized_reader::SerializedPageReader;
use parquet::file::statistics::Statistics;

use crate::error::Error;
use crate::page_header::page_sizes;

/// Bytes fetched from a file's end at first, hoping the footer and page index fit.
const FOOTER_GUESS: u64 = 256 * 1024;

/// An opened Parquet file: its name, size and metadata with the page index.
#[derive(Debug)]
pub struct ParquetFile {
    pub path: Path,
    pub size: u64,
    pub meta: ParquetMetaData,
    dictionaries: Option<Arc<DictionaryCache>>,
}

/// Which dictionary page: file, its size (a file rewritten under the same name differs), row
/// group, column.
type DictionaryKey = (Path, u64, usize, usize);

/// Decompressed dictionary pages of column chunks, shared by the files of a catalog, bounded
/// in bytes.
#[derive(Debug)]
pub struct DictionaryCache(Mutex<crate::cache::Lru<DictionaryKey, Page>>);

impl DictionaryCache {
    /// A cache of at most `bytes` of dictionary pages.
    pub fn new(bytes: usize) -> DictionaryCache {
        DictionaryCache(Mutex::new(crate::cache::Lru::new(bytes)))
    }

    fn get(&self, key: &DictionaryKey) -> Option<Page> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).get(key)
    }

    fn put(&self, key: DictionaryKey, page: &Page) {
        let weight = page.buffer().len() + 64;
        self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(key, page.clone(), weight);
    }
}

impl ParquetFile {
    /// Fetches and parses the footer and page index of `path`.
    pub async fn open(store: &dyn ObjectStore, path: &Path) -> Result<ParquetFile, Error> {
        let opts = GetOptions { range: Some(GetRange::Suffix(FOOTER_GUESS)), ..GetOptions::default() };
        let got = store.get_opts(path, opts).await.map_err(Error::store("read", path))?;
        let size = got.meta.size;
        let mut tail = got.bytes().await.map_err(Error::store("read", path))?;
        let corrupt = |e: ParquetError| Error::corrupt(path, format!("bad footer: {e}"));
        let mut reader = ParquetMetaDataReader::new().with_page_index_policy(PageIndexPolicy::Required);
        loop {
            let parsed = if reader.has_metadata() {
                reader.read_page_indexes_sized(&tail, size)
            } else {
                reader.try_parse_sized(&tail, size)
            };
            match parsed {
                Ok(()) => break,
                Err(ParquetError::NeedMoreData(needed)) if (needed as u64) <= size && needed > tail.len() => {
                    let range = size - needed as u64..size;
                    tail = store.get_range(path, range).await.map_err(Error::store("read", path))?;
                }
                Err(e) => return Err(corrupt(e)),
            }
        }
        let meta = reader.finish().map_err(corrupt)?;
        check_column_chunks(&meta, size).map_err(|e| Error::corrupt(path, e))?;
        Ok(ParquetFile { path: path.clone(), size, meta, dictionaries: None })
    }

    /// Keeps the file's dictionary pages in `cache` once decoded, and takes them from there.
    pub fn with_dictionary_cache(mut self, cache: Arc<DictionaryCache>) -> ParquetFile {
        self.dictionaries = Some(cache);
        self
    }

    fn cached_dictionary(&self, rg: usize, col: usize) -> Option<Page> {
        self.dictionaries.as_ref()?.get(&(self.path.clone(), self.size, rg, col))
    }

    /// Rows of the file.
    pub fn rows(&self) -> u64 {
        self.meta.file_metadata().num_rows().max(0) as u64
    }

    /// The parts of file rows `rows` in each row group they touch.
    pub fn spans(&self, rows: Range<u64>) -> Vec<Span> {
        let mut out = Vec::new();
        let mut first = 0u64;
        for (rg, g) in self.meta.row_groups().iter().enumerate() {
            let n = g.num_rows().max(0) as u64;
            let (a, b) = (rows.start.max(first), rows.end.min(first + n));
            if a < b {
                out.push(Span { rg, start: (a - first) as usize, end: (b - first) as usize });
            }
            first += n;
            if first >= rows.end {
                break;
            }
        }
        out
    }

    /// Row groups whose statistics say column `col` (a UTF-8 string column) may hold `key`,
    /// with the file row each starts at.
    pub fn row_groups_with_key(&self, col: usize, key: &str) -> Vec<(usize, u64)> {
        let mut out = Vec::new();
        let mut first = 0u64;
        for (rg, g) in self.meta.row_groups().iter().enumerate() {
            let may = match g.column(col).statistics() {
                Some(Statistics::ByteArray(s)) => match (s.min_opt(), s.max_opt()) {
                    (Some(min), Some(max)) => min.data() <= key.as_bytes() && key.as_bytes() <= max.data(),
                    _ => true,
                },
                _ => true,
            };
            if may {
                out.push((rg, first));
            }
            first += g.num_rows().max(0) as u64;
        }
        out
    }

    /// Within `span`, the first row that may hold a value of the sorted int64 column `col` at
    /// or after `floor`, by the page index: pages whose maximum is below it are skipped.
    pub fn first_row_from(&self, span: &Span, col: usize, floor: i64) -> usize {
        let index = self.meta.page_index_for_row_group(span.rg);
        let (Some(ColumnIndexMetaData::INT64(ci)), Some(oi)) = (index.column_index(col), index.offset_index(col))
        else {
            return span.start;
        };
        let locs = oi.page_locations();
        for (i, loc) in locs.iter().enumerate() {
            let page_start = loc.first_row_index as usize;
            let page_end = locs.get(i + 1).map_or(usize::MAX, |n| n.first_row_index as usize);
            if page_end <= span.start || page_start >= span.end {
                continue;
            }
            // Rows of the span are sorted, so a page whose maximum is below the floor holds no
            // row of the span at or after it (rows of it outside the span only keep it).
            if ci.max_value(i).is_some_and(|&max| max < floor) {
                continue;
            }
            return page_start.max(span.start);
        }
        span.end
    }

    /// Fetches what decoding `cols` of `span` needs: each column's dictionary page and the
    /// data pages overlapping the span (the whole column chunk without a page index).
    pub async fn fetch(&self, store: &dyn ObjectStore, span: &Span, cols: &[usize]) -> Result<Pages, Error> {
        let mut ranges: Vec<Range<u64>> = Vec::new();
        let index = self.meta.page_index_for_row_group(span.rg);
        // Offsets and sizes come from the file: a damaged footer or page index may hold negative
        // or overflowing ones, which must be an error, not a panic (found by fuzzing).
        let bad_location = || Error::corrupt(&self.path, "a page location is negative or overflows");
        let range = |start: i64, len: i64| -> Result<Range<u64>, Error> {
            let a = u64::try_from(start).map_err(|_| bad_location())?;
            let n = u64::try_from(len).map_err(|_| bad_location())?;
            Ok(a..a.checked_add(n).ok_or_else(bad_location)?)
        };
        for &col in cols {
            let chunk = self.column_chunk(span.rg, col)?;
            let (chunk_start, chunk_len) = chunk.byte_range();
            let Some(oi) = index.offset_index(col) else {
                ranges.push(chunk_start..chunk_start.checked_add(chunk_len).ok_or_else(bad_location)?);
                continue;
            };
            let locs = oi.page_locations();
            if let Some(first) = locs.first() {
                let first_offset = u64::try_from(first.offset).map_err(|_| bad_location())?;
                if first_offset > chunk_start && self.cached_dictionary(span.rg, col).is_none() {
                    ranges.push(chunk_start..first_offset);
                }
            }
            for (i, loc) in locs.iter().enumerate() {
                let page_start = usize::try_from(loc.first_row_index).map_err(|_| bad_location())?;
                let page_end = match locs.get(i + 1) {
                    Some(n) => usize::try_from(n.first_row_index).map_err(|_| bad_location())?,
                    None => usize::MAX,
                };
                if page_end > span.start && page_start < span.end {
                    ranges.push(range(loc.offset, i64::from(loc.compressed_page_size))?);
                }
            }
        }
        ranges.sort_by_key(|r| r.start);
        // Adjacent pages become one request.
        let mut merged: Vec<Range<u64>> = Vec::new();
        for r in ranges {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        if merged.iter().any(|r| r.end > self.size) {
            return Err(Error::corrupt(&self.path, "column chunk lies beyond the end of the file"));
        }
        let bytes = store.get_ranges(&self.path, &merged).await.map_err(Error::store("read", &self.path))?;
        let mut parts: Vec<(u64, Bytes)> = merged.iter().map(|r| r.start).zip(bytes).collect();
        parts.sort_by_key(|p| p.0);
        Ok(Pages(Arc::new(Sparse { parts, size: self.size })))
    }

    /// Fetches bytes `range` of the file whole (e.g. a row group, to check its hash), as pages
    /// to decode every column chunk within it, and the bytes.
    pub async fn fetch_range(&self, store: &dyn ObjectStore, range: Range<u64>) -> Result<(Pages, Bytes), Error> {
        if range.end > self.size || range.start > range.end {
            return Err(Error::corrupt(&self.path, format!("bytes {range:?} lie beyond the end of the file")));
        }
        let bytes = store.get_range(&self.path, range.clone()).await.map_err(Error::store("read", &self.path))?;
        if bytes.len() as u64 != range.end - range.start {
            return Err(Error::corrupt(&self.path, format!("bytes {range:?} read back short")));
        }
        let pages = Pages(Arc::new(Sparse { parts: vec![(range.start, bytes.clone())], size: self.size }));
        Ok((pages, bytes))
    }

    /// Column `col`'s chunk in row group `rg`: a file of another schema has fewer columns than
    /// its name promises, which is an error, not an index out of bounds.
    fn column_chunk(&self, rg: usize, col: usize) -> Result<&parquet::file::metadata::ColumnChunkMetaData, Error> {
        let group =
            self.meta.row_groups().get(rg).ok_or_else(|| Error::corrupt(&self.path, format!("no row group {rg}")))?;
        let columns = group.num_columns().min(self.meta.file_metadata().schema_descr().num_columns());
        if col >= columns {
            return Err(Error::corrupt(&self.path, format!("row group {rg} has {columns} columns, not column {col}")));
        }
        Ok(group.column(col))
    }

    /// Decodes rows `span` of column `col` from `pages` (fetched for at least that span).
    ///
    /// The parquet crate's decoders trust the page bytes in places the checks at open cannot
    /// reach (found by fuzzing, fuzz/regressions/tier_manifest: a delta-encoded page declaring
    /// no values but holding a first one underflows a counter, crash-d7c9…; a bit-packed run
    /// longer than its page trips an assertion in `bit_util`, crash-c902…). A panic inside
    /// them is caught here and becomes a corrupt-file error naming the column: the reader,
    /// which it leaves half-done, is dropped with it, and nothing else is shared.
    pub fn decode<T: DataType>(&self, pages: &Pages, span: &Span, col: usize) -> Result<Vec<T::T>, Error> {
        let decoded =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.decode_unguarded::<T>(pages, span, col)));
        decoded.unwrap_or_else(|panic| {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            Err(Error::corrupt(
                &self.path,
                format!("row group {}, column {col}: the Parquet decoder failed: {why}", span.rg),
            ))
        })
    }

    fn decode_unguarded<T: DataType>(&self, pages: &Pages, span: &Span, col: usize) -> Result<Vec<T::T>, Error> {
        let corrupt = |e: ParquetError| Error::corrupt(&self.path, format!("row group {}, column {col}: {e}", span.rg));
        let chunk = self.column_chunk(span.rg, col)?;
        let group = self.meta.row_group(span.rg);
        let locations =
            self.meta.page_index_for_row_group(span.rg).offset_index(col).map(|o| o.page_locations().clone());
        check_page_headers(&pages.0, chunk, locations.as_deref())
            .map_err(|why| Error::corrupt(&self.path, format!("row group {}, column {col}: {why}", span.rg)))?;
        let mut inner =
            SerializedPageReader::new(Arc::clone(&pages.0), chunk, group.num_rows().max(0) as usize, locations)
                .map_err(corrupt)?;
        let mut pending = self.cached_dictionary(span.rg, col);
        if pending.is_some() {
            if inner.peek_next_page().map_err(corrupt)?.is_some_and(|p| p.is_dict) {
                // Its bytes were not fetched; skipping it (by its location) reads nothing.
                inner.skip_next_page().map_err(corrupt)?;
            } else {
                pending = None;
            }
        }
        let replaced = pending.is_some();
        let fill = match (&pending, &self.dictionaries) {
            (None, Some(cache)) => Some((Arc::clone(cache), (self.path.clone(), self.size, span.rg, col))),
            _ => None,
        };
        let page_reader: Box<dyn PageReader> =
            Box::new(CachingPages { inner, pending, deferred: None, replaced, fill, has_dictionary: false });
        let descr = self.meta.file_metadata().schema_descr().column(col);
        let mut reader = ColumnReaderImpl::<T>::new(descr, page_reader);
        let skipped = reader.skip_records(span.start).map_err(corrupt)?;
        if skipped != span.start {
            return Err(corrupt(ParquetError::General(format!("row group ends after {skipped} rows"))));
        }
        let want = span.end - span.start;
        let mut out = Vec::with_capacity(want);
        while out.len() < want {
            let (records, _, _) = reader.read_records(want - out.len(), None, None, &mut out).map_err(corrupt)?;
            if records == 0 {
                return Err(corrupt(ParquetError::General(format!("column ends after {} of {want} rows", out.len()))));
            }
        }
        Ok(out)
    }
}

/// Every column chunk of `meta` lies within a file of `size` bytes, and every page its offset
/// index locates lies within its chunk, in row order. The parquet crate's page reader trusts
/// both: `ColumnChunkMetaData::byte_range` asserts that a chunk's start and length are not
/// negative, and a first page located before its chunk's start overflows a subtraction
/// (serialized_reader.rs:696). Damaged footers and page indexes panicked there (found by
/// fuzzing, fuzz/regressions/tier_manifest and tier_points), so such a file is refused at open.
fn check_column_chunks(meta: &ParquetMetaData, size: u64) -> Result<(), String> {
    for (rg, group) in meta.row_groups().iter().enumerate() {
        let index = meta.page_index_for_row_group(rg);
        for (col, chunk) in group.columns().iter().enumerate() {
            let start = chunk.dictionary_page_offset().unwrap_or(chunk.data_page_offset());
            let len = chunk.compressed_size();
            let end = u64::try_from(start).ok().zip(u64::try_from(len).ok()).and_then(|(a, n)| a.checked_add(n));
            let Some(end) = end.filter(|&end| end <= size) else {
                return Err(format!(
                    "row group {rg}, column {col}: its chunk at offset {start}, {len} bytes long, lies outside the file of {size} bytes"
                ));
            };
            let Some(offsets) = index.offset_index(col) else { continue };
            let mut rows_from = 0;
            for (i, loc) in offsets.page_locations().iter().enumerate() {
                let page_end = u64::try_from(loc.offset)
                    .ok()
                    .zip(u64::try_from(loc.compressed_page_size).ok())
                    .and_then(|(a, n)| a.checked_add(n));
                let within = page_end.is_some_and(|page_end| loc.offset >= start && page_end <= end);
                if !within || loc.first_row_index < rows_from {
                    return Err(format!(
                        "row group {rg}, column {col}: page {i}'s location (offset {}, {} bytes, first row {}) lies \
                         outside its chunk ({start}..{end}) or out of row order",
                        loc.offset, loc.compressed_page_size, loc.first_row_index
                    ));
                }
                rows_from = loc.first_row_index;
            }
        }
    }
    Ok(())
}

/// Checks the sizes declared by the header of every page of `chunk` that `pages` holds (see
/// [`crate::page_header`]), at the pages `locations` locate (and the dictionary page before
/// them) or, without an offset index, page after page from the chunk's start. Pages not
/// fetched are not read by the decoder either.
fn check_page_headers(
    pages: &Sparse,
    chunk: &ColumnChunkMetaData,
    locations: Option<&[PageLocation]>,
) -> Result<(), String> {
    let (start, len) = chunk.byte_range();
    let end = start.saturating_add(len);
    // A page's bytes as the decoder takes them: `len` of them, or (without an offset index)
    // what follows its start; `None` if they were not fetched.
    let header_at = |at: u64, len: Option<usize>| match pages.slice(at, len) {
        Ok(bytes) if !bytes.is_empty() => page_sizes(&bytes).map(Some),
        _ => Ok(None),
    };
    if let Some(locations) = locations {
        let offset = |l: &PageLocation| u64::try_from(l.offset).unwrap_or(0);
        let first = locations.first().map_or(end, offset);
        if first > start {
            header_at(start, usize::try_from(first - start).ok())?;
        }
        for l in locations {
            header_at(offset(l), usize::try_from(l.compressed_page_size).ok())?;
        }
        return Ok(());
    }
    let mut at = start;
    while at < end {
        let Some(sizes) = header_at(at, None)? else { break };
        at = at.saturating_add(sizes.header_len as u64).saturating_add(sizes.compressed as u64);
    }
    Ok(())
}

/// A column chunk's pages, with its dictionary page served from a [`DictionaryCache`]
/// (`pending`: the inner reader's was skipped unread) or put there once read (`fill`).
struct CachingPages {
    inner: SerializedPageReader<Sparse>,
    pending: Option<Page>,
    /// The cached dictionary page after the column reader skipped it, to hand out on demand.
    deferred: Option<Page>,
    /// The inner reader's dictionary page was skipped for the cached one: never read it.
    replaced: bool,
    fill: Option<(Arc<DictionaryCache>, DictionaryKey)>,
    /// A dictionary page went to the column reader (from `get_next_page` or as a deferred one).
    has_dictionary: bool,
}

impl CachingPages {
    fn remember(&mut self, page: &Option<Page>) {
        if let Some(p) = page
            && p.page_type() == PageType::DICTIONARY_PAGE
            && let Some((cache, key)) = self.fill.take()
        {
            cache.put(key, p);
        }
    }
}

impl Iterator for CachingPages {
    type Item = parquet::errors::Result<Page>;

    fn next(&mut self) -> Option<Self::Item> {
        self.get_next_page().transpose()
    }
}

impl PageReader for CachingPages {
    fn get_next_page(&mut self) -> parquet::errors::Result<Option<Page>> {
        let page = match self.pending.take() {
            Some(p) => Some(p),
            None => {
                let page = self.inner.get_next_page()?;
                self.remember(&page);
                page
            }
        };
        match &page {
            Some(Page::DictionaryPage { .. }) => self.has_dictionary = true,
            // The column reader installs a deferred dictionary before decoding such a page, and
            // the parquet crate panics when there is none ("Decoder for dict should have been
            // set"; found by fuzzing, fuzz/regressions/tier_points): take it here to check, and
            // keep it for the reader.
            Some(p)
                if !self.has_dictionary
                    && matches!(p.encoding(), Encoding::PLAIN_DICTIONARY | Encoding::RLE_DICTIONARY) =>
            {
                match self.take_deferred_dictionary()? {
                    Some(dictionary @ Page::DictionaryPage { .. }) => self.deferred = Some(dictionary),
                    _ => return Err(ParquetError::General("a dictionary-encoded page has no dictionary page".into())),
                }
            }
            _ => {}
        }
        Ok(page)
    }

    fn peek_next_page(&mut self) -> parquet::errors::Result<Option<PageMetadata>> {
        if self.pending.is_some() {
            return Ok(Some(PageMetadata { num_rows: None, num_levels: None, is_dict: true }));
        }
        self.inner.peek_next_page()
    }

    fn skip_next_page(&mut self) -> parquet::errors::Result<()> {
        match self.pending.take() {
            Some(p) => {
                self.deferred = Some(p);
                Ok(())
            }
            None => self.inner.skip_next_page(),
        }
    }

    fn supports_deferred_dictionary(&self) -> bool {
        self.pending.is_some()
            || self.deferred.is_some()
            || (!self.replaced && self.inner.supports_deferred_dictionary())
    }

    fn take_deferred_dictionary(&mut self) -> parquet::errors::Result<Option<Page>> {
        let page = match self.deferred.take() {
            Some(p) => Some(p),
            None if self.replaced => None,
            None => {
                let page = self.inner.take_deferred_dictionary()?;
                self.remember(&page);
                page
            }
        };
        if matches!(page, Some(Page::DictionaryPage { .. })) {
            self.has_dictionary = true;
        }
        Ok(page)
    }

    fn at_record_boundary(&mut self) -> parquet::errors::Result<bool> {
        if self.pending.is_some() {
            return Ok(false);
        }
        self.inner.at_record_boundary()
    }
}

/// Rows `start..end` of row group `rg`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub rg: usize,
    pub start: usize,
    pub end: usize,
}

/// Fetched byte ranges of one file.
#[derive(Clone, Debug)]
pub struct Pages(Arc<Sparse>);

#[derive(Debug)]
struct Sparse {
    /// Disjoint ranges sorted by start.
    parts: Vec<(u64, Bytes)>,
    size: u64,
}

impl Sparse {
    fn slice(&self, start: u64, len: Option<usize>) -> parquet::errors::Result<Bytes> {
        let i = self.parts.partition_point(|p| p.0 <= start);
        let missing = || ParquetError::General(format!("bytes at offset {start} were not fetched"));
        let (base, bytes) = self.parts.get(i.checked_sub(1).ok_or_else(missing)?).ok_or_else(missing)?;
        let from = (start - base) as usize;
        let to = match len {
            Some(n) => from + n,
            None => bytes.len(),
        };
        if to > bytes.len() {
            return Err(missing());
        }
        Ok(bytes.slice(from..to))
    }
}

impl Length for Sparse {
    fn len(&self) -> u64 {
        self.size
    }
}

impl ChunkReader for Sparse {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        use bytes::Buf;
        Ok(self.slice(start, None)?.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.slice(start, Some(length))
    }
}

#[cfg(test)]
mod tests {
    use object_store::ObjectStoreExt;
    use object_store::memory::InMemory;

    use super::*;

    /// Found by fuzzing (fuzz/regressions/tier_points/crash-4ec4…): a points file whose page
    /// index holds a negative page size made `fetch` overflow and panic; a damaged archive file
    /// must be an error naming it, and the node goes on. Such a file is refused at open now.
    #[test]
    fn a_negative_page_location_is_corrupt_not_a_panic() {
        let bytes =
            include_bytes!("../../../fuzz/regressions/tier_points/crash-4ec479281a14cc2a161a83e8e4af01d903497270");
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(async {
            let (_, file) = opened(bytes, "points/class=pmu/day=2023-11-14/n1-0000000001.parquet").await;
            let e = file.expect_err("the damaged page index is found");
            assert!(e.to_string().contains("location (offset"), "{e}");
        });
    }

    /// Found by fuzzing (fuzz/regressions/tier_points/crash-d42b… and tier_manifest/crash-91f1…):
    /// a page index whose first page lies before its column chunk's start overflowed a
    /// subtraction in the parquet crate's page reader (a panic with overflow checks, a garbage
    /// page size without). Both files are refused at open, naming the page.
    #[test]
    fn a_page_located_before_its_chunk_is_refused_at_open() {
        let points =
            include_bytes!("../../../fuzz/regressions/tier_points/crash-d42b8c191a181c87a53f08240cd584dbcebbc0d9");
        let manifest =
            include_bytes!("../../../fuzz/regressions/tier_manifest/crash-91f1214d0ed4b0a272f57b0149e81a0169c07373");
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(async {
            for (bytes, path) in [
                (&points[..], "points/class=pmu/day=2023-11-14/n1-0000000001.parquet"),
                (&manifest[..], "manifests/class=pmu/day=2023-11-14/n1-0000000001.parquet"),
            ] {
                let (_, file) = opened(bytes, path).await;
                let e = file.expect_err("a page outside its chunk");
                assert!(e.to_string().contains("outside its chunk"), "{path}: {e}");
            }
        });
    }

    /// Found by fuzzing (fuzz/regressions/tier_manifest/crash-d7c9…): a delta-encoded page
    /// declaring no values but holding a first one underflowed a counter inside the parquet
    /// crate's decoder, past every check at open. Decoding it is a corrupt-file error naming
    /// the column, however the decoder fails (a panic with overflow checks, an error without).
    #[test]
    fn a_page_the_parquet_decoder_fails_on_is_a_corrupt_file_error() {
        use parquet::data_type::{ByteArrayType, DoubleType, Int64Type};
        let bytes =
            include_bytes!("../../../fuzz/regressions/tier_manifest/crash-d7c9c80711f15a55b9827ad4f4491c86e6954b25");
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(async {
            let (store, file) = opened(bytes, "manifests/class=pmu/day=2023-11-14/n1-0000000001.parquet").await;
            let file = file.expect("its footer and page index are whole");
            let columns = file.meta.file_metadata().schema_descr().num_columns();
            let mut failed = Vec::new();
            for rg in 0..file.meta.num_row_groups() {
                let span = Span { rg, start: 0, end: file.meta.row_group(rg).num_rows().max(0) as usize };
                let cols: Vec<usize> = (0..columns).collect();
                let pages = file.fetch(&store, &span, &cols).await.expect("fetched");
                for col in cols {
                    let descr = file.meta.file_metadata().schema_descr().column(col);
                    let decoded = match descr.physical_type() {
                        parquet::basic::Type::INT64 => file.decode::<Int64Type>(&pages, &span, col).map(drop),
                        parquet::basic::Type::DOUBLE => file.decode::<DoubleType>(&pages, &span, col).map(drop),
                        _ => file.decode::<ByteArrayType>(&pages, &span, col).map(drop),
                    };
                    if let Err(e) = decoded {
                        failed.push(e.to_string());
                    }
                }
            }
            assert!(!failed.is_empty(), "the damaged page is found");
            assert!(failed.iter().all(|e| e.contains("is corrupt") && e.contains("column ")), "{failed:?}");
        });
    }

    /// Found by fuzzing (fuzz/regressions/tier_points/oom-3eb8…): a page header declaring
    /// 1,396,079,267 uncompressed bytes made the parquet crate allocate them before
    /// decompressing (libFuzzer's malloc limit caught it; a node would have aborted, or held the
    /// memory). The header is read first now, and the page refused by its size.
    #[test]
    fn a_page_declaring_a_huge_uncompressed_size_is_refused_before_it_is_allocated() {
        use crate::schema::points as col;
        use parquet::data_type::{ByteArrayType, DoubleType, Int64Type};
        let bytes =
            include_bytes!("../../../fuzz/regressions/tier_points/oom-3eb8f4cba4f1535a289f929717d2685b4d1f883a");
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(async {
            let (store, file) = opened(bytes, "node=n1/points/class=pmu/day=2023-11-14/n1-0000000001.parquet").await;
            let file = file.expect("its footer and page index are whole");
            let mut failed = Vec::new();
            for rg in 0..file.meta.num_row_groups() {
                let span = Span { rg, start: 0, end: file.meta.row_group(rg).num_rows().max(0) as usize };
                let Ok(pages) = file.fetch(&store, &span, &[col::SERIES_KEY, col::TIMESTAMP, col::VALUE]).await else {
                    continue;
                };
                let decoded = [
                    file.decode::<ByteArrayType>(&pages, &span, col::SERIES_KEY).map(drop),
                    file.decode::<Int64Type>(&pages, &span, col::TIMESTAMP).map(drop),
                    file.decode::<DoubleType>(&pages, &span, col::VALUE).map(drop),
                ];
                failed.extend(decoded.into_iter().filter_map(Result::err).map(|e| e.to_string()));
            }
            assert!(
                failed.iter().any(|e| e.contains("is corrupt") && e.contains("1396079267 uncompressed bytes")),
                "the page is refused by its declared size: {failed:?}"
            );
        });
    }

    /// An archive file's bytes put in an in-memory store, opened.
    async fn opened(bytes: &'static [u8], path: &str) -> (InMemory, Result<ParquetFile, Error>) {
        let store = InMemory::new();
        let path = Path::from(path);
        store.put(&path, Bytes::from_static(bytes).into()).await.unwrap();
        let file = ParquetFile::open(&store, &path).await;
        (store, file)
    }

    /// Found by fuzzing (fuzz/regressions/tier_manifest/negative-column-chunk-offset): a
    /// manifest whose footer gives a column chunk a negative offset reached the parquet crate's
    /// `byte_range`, which asserts. It is refused at open, naming the chunk.
    #[test]
    fn a_column_chunk_at_a_negative_offset_is_refused_at_open() {
        let bytes = include_bytes!("../../../fuzz/regressions/tier_manifest/negative-column-chunk-offset");
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(async {
            let (_, file) = opened(bytes, "manifests/class=pmu/day=2023-11-14/n1-0000000001.parquet").await;
            let e = file.expect_err("a chunk outside the file");
            assert!(e.to_string().contains("row group 0, column 0: its chunk at offset -4096"), "{e}");
        });
    }

    /// Found by fuzzing (fuzz/regressions/tier_points/dictionary-page-missing): a points file
    /// whose dictionary-encoded column chunk lost its dictionary page made the parquet crate
    /// panic ("Decoder for dict should have been set"). Decoding it is an error naming the
    /// column; the other columns still decode.
    #[test]
    fn a_dictionary_encoded_chunk_without_its_dictionary_is_corrupt_not_a_panic() {
        use parquet::data_type::{ByteArrayType, Int64Type};

        use crate::schema::points as col;
        let bytes = include_bytes!("../../../fuzz/regressions/tier_points/dictionary-page-missing");
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(async {
            let (store, file) = opened(bytes, "points/class=pmu/day=2023-11-14/n1-0000000001.parquet").await;
            let file = file.expect("the footer is whole");
            let span = Span { rg: 0, start: 0, end: file.meta.row_group(0).num_rows() as usize };
            let pages = file.fetch(&store, &span, &[col::SERIES_KEY, col::TIMESTAMP]).await.expect("fetched");
            let e = file.decode::<ByteArrayType>(&pages, &span, col::SERIES_KEY).expect_err("no dictionary");
            assert!(
                e.to_string().contains("column 0: Parquet error: a dictionary-encoded page has no dictionary page"),
                "{e}"
            );
            let ts = file.decode::<Int64Type>(&pages, &span, col::TIMESTAMP).expect("timestamps are whole");
            assert_eq!(ts.len(), span.end);
        });
    }

    /// A file of another schema (a manifest under a points file's name) has fewer columns than
    /// asked for: an error, not an index out of bounds.
    #[test]
    fn a_column_the_file_does_not_have_is_an_error() {
        let bytes = include_bytes!("../../../fuzz/corpus/tier_manifest/one-block");
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(async {
            let (store, file) = opened(bytes, "points/class=pmu/day=2023-11-14/n1-0000000001.parquet").await;
            let file = file.expect("a whole file");
            let span = Span { rg: 0, start: 0, end: 1 };
            let e = file.fetch(&store, &span, &[40]).await.expect_err("no column 40");
            assert!(e.to_string().contains("not column 40"), "{e}");
        });
    }
}
