//! The Parquet schemas of points files and manifests, and how each column is encoded
//! (FORMAT.md, "Points files" and "Manifests").

use std::sync::Arc;

use parquet::basic::{Compression, Encoding, LogicalType, Repetition, TimeUnit, Type as Physical, ZstdLevel};
use parquet::file::metadata::SortingColumn;
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::schema::types::{ColumnPath, Type, TypePtr};
use timeshard_proto::SeriesKey;
use timeshard_proto::key::series_hash;

/// Columns of a points file, in order.
pub mod points {
    pub const SERIES_KEY: usize = 0;
    pub const SERIES_ID: usize = 1;
    pub const TIMESTAMP: usize = 2;
    pub const VALUE: usize = 3;
    pub const EVENT_ID: usize = 4;
    pub const NAMES: [&str; 5] = ["series_key", "series_id", "timestamp", "value", "event_id"];
}

/// Columns of a manifest, in order.
pub mod manifest {
    pub const SERIES_KEY: usize = 0;
    pub const QUANTUM_START: usize = 1;
    pub const QUANTUM_NS: usize = 2;
    pub const ROW_START: usize = 3;
    pub const ROWS: usize = 4;
    pub const MIN: usize = 5;
    pub const MAX: usize = 6;
    pub const SUM: usize = 7;
    pub const FIRST_TS: usize = 8;
    pub const FIRST_VALUE: usize = 9;
    pub const FIRST_EVENT: usize = 10;
    pub const LAST_TS: usize = 11;
    pub const LAST_VALUE: usize = 12;
    pub const LAST_EVENT: usize = 13;
    pub const DIGEST: usize = 14;
    pub const COVERS: usize = 15;
    pub const BASE: usize = 16;
    pub const NAMES: [&str; 17] = [
        "series_key",
        "quantum_start",
        "quantum_ns",
        "row_start",
        "rows",
        "min",
        "max",
        "sum",
        "first_ts",
        "first_value",
        "first_event",
        "last_ts",
        "last_value",
        "last_event",
        "digest",
        "covers",
        "base",
    ];
}

/// The `series_id` column: the first 64 of the 80 bits of SHA-1 that key the series in the DHT
/// ([`timeshard_proto::key::series_hash`]), big-endian, as an unsigned integer.
pub fn series_id(series: &SeriesKey) -> u64 {
    let h = series_hash(series);
    u64::from_be_bytes(h[..8].try_into().expect("8 of 10 bytes"))
}

/// How the `value` column of a points file is encoded; the exporter picks one per file from a
/// sample of its values ([`ValueEncoding::choose`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueEncoding {
    /// A dictionary per row group: values that repeat (sensor readings of fixed precision, as
    /// the `pmu` dataset: 3 decimals) cost one small index each.
    Dictionary,
    /// BYTE_STREAM_SPLIT: the eight bytes of each value in eight streams, so zstd finds the
    /// shared exponents and the zero low bytes of integers (counters).
    ByteStreamSplit,
}

impl ValueEncoding {
    /// Picks the encoding for a file whose first row group holds `values`: the dictionary when
    /// they have at most a quarter as many distinct values as rows and the dictionary fits its
    /// page ([`DICTIONARY_VALUES`]), else BYTE_STREAM_SPLIT. (A dictionary of `d` values over
    /// `n` rows costs about `8d + n log2(d) / 8` bytes before zstd: less than the ~6 bytes per
    /// value BYTE_STREAM_SPLIT leaves of 3-decimal readings once `d <= n / 4`; FORMAT.md.)
    pub fn choose(values: &[f64]) -> ValueEncoding {
        if values.is_empty() {
            return ValueEncoding::ByteStreamSplit;
        }
        let mut bits: Vec<u64> = values.iter().map(|v| v.to_bits()).collect();
        bits.sort_unstable();
        bits.dedup();
        if bits.len() * 4 <= values.len() && bits.len() <= DICTIONARY_VALUES {
            ValueEncoding::Dictionary
        } else {
            ValueEncoding::ByteStreamSplit
        }
    }

    /// The name in manifests and FORMAT.md.
    pub fn name(self) -> &'static str {
        match self {
            ValueEncoding::Dictionary => "dictionary",
            ValueEncoding::ByteStreamSplit => "byte_stream_split",
        }
    }
}

/// Most distinct values a row group's dictionary of values holds (1 MiB of doubles); a row
/// group with more falls back to BYTE_STREAM_SPLIT for its remaining pages.
pub const DICTIONARY_VALUES: usize = 1 << 17;

fn col(name: &str, physical: Physical, logical: Option<LogicalType>) -> TypePtr {
    Arc::new(
        Type::primitive_type_builder(name, physical)
            .with_repetition(Repetition::REQUIRED)
            .with_logical_type(logical)
            .build()
            .expect("a valid column"),
    )
}

fn string() -> Option<LogicalType> {
    Some(LogicalType::String)
}
fn timestamp_ns() -> Option<LogicalType> {
    Some(LogicalType::timestamp(true, TimeUnit::NANOS))
}
fn unsigned64() -> Option<LogicalType> {
    Some(LogicalType::integer(64, false))
}

fn message(name: &str, fields: Vec<TypePtr>) -> TypePtr {
    Arc::new(Type::group_type_builder(name).with_fields(fields).build().expect("a valid schema"))
}

/// The schema of a points file.
pub fn points_schema() -> TypePtr {
    use points::NAMES as N;
    message(
        "timeshard_points",
        vec![
            col(N[0], Physical::BYTE_ARRAY, string()),
            col(N[1], Physical::INT64, unsigned64()),
            col(N[2], Physical::INT64, timestamp_ns()),
            col(N[3], Physical::DOUBLE, None),
            col(N[4], Physical::INT64, unsigned64()),
        ],
    )
}

/// The schema of a manifest.
pub fn manifest_schema() -> TypePtr {
    use manifest::NAMES as N;
    let i64c = |n| col(n, Physical::INT64, None);
    let f64c = |n| col(n, Physical::DOUBLE, None);
    let tsc = |n| col(n, Physical::INT64, timestamp_ns());
    let u64c = |n| col(n, Physical::INT64, unsigned64());
    message(
        "timeshard_manifest",
        vec![
            col(N[0], Physical::BYTE_ARRAY, string()),
            tsc(N[1]),
            i64c(N[2]),
            i64c(N[3]),
            i64c(N[4]),
            f64c(N[5]),
            f64c(N[6]),
            f64c(N[7]),
            tsc(N[8]),
            f64c(N[9]),
            u64c(N[10]),
            tsc(N[11]),
            f64c(N[12]),
            u64c(N[13]),
            u64c(N[14]),
            u64c(N[15]),
            u64c(N[16]),
        ],
    )
}

/// zstd level of every column: level 3 compresses the encoded columns nearly as well as 9
/// (FORMAT.md, "Encodings") at several times the speed.
pub const ZSTD_LEVEL: i32 = 3;
/// Rows per data page: the unit readers skip by with the page index.
pub const PAGE_ROWS: usize = 8192;

fn base_properties() -> parquet::file::properties::WriterPropertiesBuilder {
    WriterProperties::builder()
        .set_writer_version(WriterVersion::PARQUET_1_0)
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(ZSTD_LEVEL).expect("valid level")))
        .set_statistics_enabled(EnabledStatistics::Page)
        // Exact bounds for series keys (at most 512 bytes), so row groups prune exactly.
        .set_statistics_truncate_length(None)
        .set_column_index_truncate_length(None)
        .set_data_page_row_count_limit(PAGE_ROWS)
        .set_created_by(concat!("timeshard-tier ", env!("CARGO_PKG_VERSION")).to_string())
}

/// Writer settings of a points file whose values suit `value`.
pub fn points_properties(value: ValueEncoding) -> WriterProperties {
    let path = |i: usize| ColumnPath::from(points::NAMES[i]);
    let b = base_properties()
        .set_dictionary_enabled(true)
        .set_column_dictionary_enabled(path(points::TIMESTAMP), false)
        .set_column_encoding(path(points::TIMESTAMP), Encoding::DELTA_BINARY_PACKED)
        .set_sorting_columns(Some(vec![
            SortingColumn { column_idx: points::SERIES_KEY as i32, descending: false, nulls_first: false },
            SortingColumn { column_idx: points::TIMESTAMP as i32, descending: false, nulls_first: false },
        ]));
    let b = match value {
        ValueEncoding::Dictionary => b
            .set_column_dictionary_page_size_limit(path(points::VALUE), DICTIONARY_VALUES * 8)
            .set_column_encoding(path(points::VALUE), Encoding::BYTE_STREAM_SPLIT),
        ValueEncoding::ByteStreamSplit => b
            .set_column_dictionary_enabled(path(points::VALUE), false)
            .set_column_encoding(path(points::VALUE), Encoding::BYTE_STREAM_SPLIT),
    };
    b.build()
}

/// Writer settings of a manifest.
pub fn manifest_properties() -> WriterProperties {
    let path = |i: usize| ColumnPath::from(manifest::NAMES[i]);
    // Snappy, not zstd: a manifest is small and every node decodes each one, and zstd creates
    // a context per column chunk (17 per manifest), each asking the CPU for its features, a
    // trap on a virtual machine that cost more than the decoding.
    let mut b = base_properties().set_compression(Compression::SNAPPY).set_dictionary_enabled(false);
    b = b.set_column_dictionary_enabled(path(manifest::SERIES_KEY), true);
    for c in [manifest::QUANTUM_START, manifest::ROW_START, manifest::FIRST_TS, manifest::LAST_TS] {
        b = b.set_column_encoding(path(c), Encoding::DELTA_BINARY_PACKED);
    }
    for c in [manifest::QUANTUM_NS, manifest::ROWS, manifest::FIRST_EVENT, manifest::LAST_EVENT, manifest::BASE] {
        b = b.set_column_dictionary_enabled(path(c), true);
    }
    for c in [manifest::MIN, manifest::MAX, manifest::SUM, manifest::FIRST_VALUE, manifest::LAST_VALUE] {
        b = b.set_column_encoding(path(c), Encoding::BYTE_STREAM_SPLIT);
    }
    b.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_id_is_the_series_hash_prefix() {
        let s: SeriesKey = "pmu.phase{bus=1,site=atl}".parse().unwrap();
        let h = series_hash(&s);
        assert_eq!(series_id(&s).to_be_bytes(), h[..8]);
        assert_ne!(series_id(&s), series_id(&"pmu.phase{bus=2,site=atl}".parse().unwrap()));
    }

    #[test]
    fn value_encoding_follows_repetition() {
        let repeating: Vec<f64> = (0..1000).map(|i| (i % 50) as f64 / 1000.0).collect();
        assert_eq!(ValueEncoding::choose(&repeating), ValueEncoding::Dictionary);
        let distinct: Vec<f64> = (0..1000).map(|i| i as f64).collect();
        assert_eq!(ValueEncoding::choose(&distinct), ValueEncoding::ByteStreamSplit);
    }

    #[test]
    fn schemas_have_the_documented_columns() {
        let p = parquet::schema::types::SchemaDescriptor::new(points_schema());
        let names: Vec<_> = p.columns().iter().map(|c| c.name().to_string()).collect();
        assert_eq!(names, points::NAMES);
        let m = parquet::schema::types::SchemaDescriptor::new(manifest_schema());
        assert_eq!(m.num_columns(), manifest::NAMES.len());
    }
}
