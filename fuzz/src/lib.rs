//! The fuzz targets of timeshard: one function per decoder of outside bytes, each feeding
//! arbitrary bytes to the project's own public decode path and checking what must hold whatever
//! the input (no panic, no abort, no allocation of a declared size, round trips where there is
//! an encoder).
//!
//! Two drivers call them: `fuzz/fuzz_targets/<target>.rs` under cargo-fuzz (libFuzzer, nightly;
//! `scripts/fuzz` runs them all), and `tests/replay.rs` on stable, which replays the committed
//! seed corpora (`fuzz/corpus/<target>/`) and every crash ever found
//! (`fuzz/regressions/<target>/`) as part of the test command.
//!
//! A target never trusts its input for a size: the decoders take explicit limits, and the limits
//! used here are the node's defaults.

#[cfg(feature = "node")]
pub mod fleet;
pub mod seeds;

use std::sync::Arc;

use timeshard_formats::influxql;
use timeshard_formats::line_protocol::{self, Precision};
use timeshard_formats::long_lines::{LongLines, without_long_lines};
use timeshard_formats::{compression, remote_write};
use timeshard_proto::wire::{self, Request, Response};
use timeshard_store::faulty_disk::FaultyDisk;
use timeshard_store::{DiskConfig, DiskStore, Store};

/// A fuzz target: a name (its corpus directory and binary) and the function.
pub type Target = (&'static str, fn(&[u8]));

/// Every target, in the order `scripts/fuzz` runs them.
pub const TARGETS: &[Target] = &[
    ("wire_request", wire_request),
    ("wire_response", wire_response),
    ("line_protocol", line_protocol),
    ("influxql", influxql),
    ("csv_points", csv_points),
    ("promql", promql),
    ("prometheus_api", prometheus_api),
    ("remote_write", remote_write),
    ("remote_read", remote_read),
    ("gzip", gzip),
    ("snappy", snappy),
    ("store_block", store_block),
    ("store_wal_record", store_wal_record),
    ("store_open", store_open),
    ("tier_manifest", tier_manifest),
    ("tier_points", tier_points),
    ("csr", csr),
    ("control_json", control_json),
    ("policy_module", policy_module),
    ("policy_signature", policy_signature),
    ("policy_floors", policy_floors),
    #[cfg(feature = "node")]
    ("node_config", node_config),
    #[cfg(feature = "node")]
    ("gossip_entry", gossip_entry),
];

/// The node's default limit on one message (16 MiB) and on a request body (32 MiB).
const MESSAGE_LIMIT: usize = 16 << 20;
const BODY_LIMIT: usize = 32 << 20;
/// A fixed "now" (2023-11-14T22:13:20Z), so a crash replays exactly.
pub(crate) const NOW_NS: i64 = 1_700_000_000_000_000_000;

/// A peer's or client's request frame body: decoded, then checked as the server checks it.
pub fn wire_request(data: &[u8]) {
    let Ok(request) = wire::decode::<Request>(data) else { return };
    // What decodes encodes again within the limit it came in, and that encoding is stable
    // (bytes, not values: a NaN in a location is not equal to itself).
    let again = wire::encode(&request, MESSAGE_LIMIT as u32).expect("a decoded request encodes");
    let decoded = wire::decode::<Request>(&again[wire::HEADER_BYTES..]).expect("its own encoding decodes");
    assert_eq!(wire::encode(&decoded, MESSAGE_LIMIT as u32).expect("it encodes"), again);
    if request.validate(&wire::Limits::default()).is_ok() {
        // What validates is within the limits, and a client request is checked once more.
        match request {
            Request::Write { batch } => drop(wire::check_write(batch)),
            Request::Read { series, start, end, .. } | Request::ReadStream { series, start, end, .. } => {
                drop(wire::check_read(&series, start, end))
            }
            _ => {}
        }
    }
}

/// A node's answer as a client or a coordinator decodes it.
pub fn wire_response(data: &[u8]) {
    let Ok(response) = wire::decode::<Response>(data) else { return };
    if let Response::Batch { runs, .. } = &response {
        let _ = timeshard_proto::stream::ColumnBatch::from_runs(runs);
    }
}

/// An InfluxDB line-protocol body; the first byte picks the precision.
pub fn line_protocol(data: &[u8]) {
    let Some((&p, body)) = data.split_first() else { return };
    let precision =
        [Precision::Ns, Precision::Us, Precision::Ms, Precision::S, Precision::M, Precision::H][usize::from(p) % 6];
    let parsed = line_protocol::parse(body, precision, NOW_NS);
    let points: usize = parsed.batch.iter().map(|s| s.points.len()).sum();
    assert_eq!(points, parsed.points, "the parser counts what it keeps");
    // The over-long line guard, with a limit small enough to matter: fed in chunks as a body
    // arrives, it keeps what it keeps of the whole body at once, and the parser takes the rest.
    let (limit, chunk) = (usize::from(p) * 3, usize::from(p % 7) + 1);
    let mut lines = LongLines::new(limit);
    let mut out = Vec::new();
    for c in body.chunks(chunk) {
        lines.copy(c, &mut out);
    }
    let (whole, again) = without_long_lines(body, limit);
    assert_eq!(out, &*whole, "chunked and whole copies agree");
    assert_eq!(lines.count(), again.count());
    let mut guarded = line_protocol::parse(&out, precision, NOW_NS);
    lines.refuse_in(&mut guarded);
    assert!(guarded.errors.len() <= line_protocol::MAX_REPORTED_ERRORS);
}

/// A CSV file for `timeshard import` or `put`: the first byte says whether the series is given
/// (odd) or in each row (even).
pub fn csv_points(data: &[u8]) {
    use timeshard_formats::csv_points::CsvPoints;
    let Some((&which, body)) = data.split_first() else { return };
    let series = (which & 1 == 1).then(|| "pmu.phase{bus=7}".parse().expect("a valid key"));
    let mut reader = CsvPoints::new(body, series, NOW_NS);
    let mut rows = 0usize;
    while let Ok(Some(_)) = reader.next_point() {
        rows += 1;
    }
    // Every row is one point, and grouping keeps them all.
    if let Ok(batch) = CsvPoints::new(body, None, NOW_NS).read_all() {
        let grouped: usize = batch.iter().map(|s| s.points.len()).sum();
        assert!(grouped <= body.len(), "no more points than bytes");
    }
    assert!(rows <= body.len(), "no more points than bytes");
}

/// An InfluxQL query string.
pub fn influxql(data: &[u8]) {
    let _ = influxql::parse(&String::from_utf8_lossy(data), NOW_NS);
}

/// Limits of a PromQL query under fuzzing: the node's, with the work per query cut so that a
/// valid but expensive query ends within the fuzzer's timeout.
fn promql_limits() -> timeshard_formats::promql::Limits {
    timeshard_formats::promql::Limits {
        max_series: 1_000,
        max_samples: 200_000,
        max_points_per_series: 1_000,
        max_output_points: 50_000,
        ..Default::default()
    }
}

/// A few series (a counter, a gauge with a NaN and an infinity, a histogram bucket pair), every
/// 15 s for 10 minutes from 0 ms, for the evaluator to read.
fn promql_source() -> timeshard_formats::promql::MemorySource {
    use timeshard_formats::promql::{Labels, MemorySource, Sample};
    let mut m = MemorySource::new();
    type Labelled = (&'static [(&'static str, &'static str)], fn(i64) -> f64);
    let series: [Labelled; 4] = [
        (&[("__name__", "http_requests_total"), ("job", "api")], |i| (i * 3) as f64),
        (&[("__name__", "temp"), ("site", "atl")], |i| match i {
            7 => f64::NAN,
            9 => f64::INFINITY,
            _ => 20.0 + (i % 5) as f64,
        }),
        (&[("__name__", "latency_bucket"), ("le", "0.5")], |i| i as f64),
        (&[("__name__", "latency_bucket"), ("le", "+Inf")], |i| (2 * i) as f64),
    ];
    for (labels, value) in series {
        m.insert(Labels::from_pairs(labels.iter().copied()), (0..40).map(|i| Sample { t: i * 15_000, v: value(i) }));
    }
    m
}

/// A PromQL query: parsed within the node's limits and, if it parses, evaluated at an instant and
/// over a range against [`promql_source`].
pub fn promql(data: &[u8]) {
    use timeshard_formats::promql::{self, Range, eval::Options, evaluate};
    let limits = promql_limits();
    let Ok(expr) = promql::parse(&String::from_utf8_lossy(data), &limits) else { return };
    let source = promql_source();
    let _ = evaluate(&expr, Range::instant(300_000), &source, &limits, Options::default());
    let range = Range { start_ms: 0, end_ms: 600_000, step_ms: 15_000 };
    let _ = evaluate(&expr, range, &source, &limits, Options::default());
}

/// Parameters of Prometheus' HTTP API and of the node's JSON API (`name=value` pairs split on
/// `&`, as a query string or form body gives them); the first byte picks the endpoint.
pub fn prometheus_api(data: &[u8]) {
    use timeshard_formats::promql::api;
    use timeshard_formats::promql::eval::Options;
    let Some((&which, body)) = data.split_first() else { return };
    let text = String::from_utf8_lossy(body);
    let params: Vec<(String, String)> = text
        .split('&')
        .take(64)
        .map(|p| match p.split_once('=') {
            Some((n, v)) => (n.to_string(), v.to_string()),
            None => (p.to_string(), String::new()),
        })
        .collect();
    let (limits, source) = (promql_limits(), promql_source());
    let answer = match which % 6 {
        0 => api::query(&params, 300_000, &source, &limits, Options::default()),
        1 => api::query_range(&params, &source, &limits, Options::default()),
        2 => api::series(&params, &source, &limits),
        3 => api::label_names(&params, &source, &limits),
        4 => api::label_values(params.first().map_or("", |(n, _)| n.as_str()), &params, &source, &limits),
        _ => {
            // The node's /v1 times and durations.
            for (_, v) in &params {
                let _ = timeshard_formats::influxql::time::parse_api_time(v, NOW_NS);
                let _ = api::parse_time(v);
                let _ = api::parse_duration(v);
            }
            return;
        }
    };
    assert!(serde_json::from_str::<serde_json::Value>(&answer.body).is_ok(), "the answer is JSON: {}", answer.body);
}

/// Prometheus remote read: a request body as the node decodes it (first byte even), or a
/// streamed answer's frames and chunks as a reader decodes them (odd).
pub fn remote_read(data: &[u8]) {
    use timeshard_formats::remote_read::{self, FrameReader, ReadLimits};
    let Some((&which, body)) = data.split_first() else { return };
    if which & 1 == 0 {
        let _ = remote_read::decode_request(body, &ReadLimits::default());
        return;
    }
    let mut frames = FrameReader::new(body, remote_read::DEFAULT_FRAME_BYTES);
    for _ in 0..64 {
        let Some(Ok(message)) = frames.next_message() else { break };
        for series in &message.chunked_series {
            let _ = remote_read::series_samples(series, 100_000);
        }
    }
}

/// A Prometheus remote-write body (snappy, then protobuf).
pub fn remote_write(data: &[u8]) {
    let _ = remote_write::decode(data, BODY_LIMIT);
}

/// A gzip body, decompressed within the body limit.
pub fn gzip(data: &[u8]) {
    if let Ok(out) = compression::gunzip(data, 1 << 20) {
        assert!(out.len() <= 1 << 20);
    }
}

/// A snappy block, decompressed within the body limit.
pub fn snappy(data: &[u8]) {
    if let Ok(out) = compression::unsnappy(data, 1 << 20) {
        assert!(out.len() <= 1 << 20);
    }
}

/// A sealed block's bytes as the store reads them from a segment.
pub fn store_block(data: &[u8]) {
    let _ = timeshard_store::block::decode_header(data);
    let _ = timeshard_store::block::decode(data);
    // A packed part as a node sends it on: the block's columns with its summary's count and
    // digest, decoded and checked by the receiver.
    if let Ok(Some((header, columns))) = timeshard_store::block::packed_columns(data) {
        let range = header.quantum.range();
        let end = timeshard_proto::stream::PartEnd { count: header.summary.count, digest: header.summary.digest };
        let _ = timeshard_proto::packed::PackedPart { range, end, columns }.points();
    }
}

/// One write-ahead-log record: the first byte is its kind.
pub fn store_wal_record(data: &[u8]) {
    let Some((&kind, body)) = data.split_first() else { return };
    let _ = timeshard_store::wal::decode(kind, body);
}

/// A whole data directory: the input is cut into files (log segments, block segments, `FORMAT`, the
/// index), either as raw bytes or as intact frames with fuzzed bodies (so the fuzzer reaches
/// the record decoders past the checksums); then the store opens it and reads everything back.
pub fn store_open(data: &[u8]) {
    let disk = Arc::new(FaultyDisk::new());
    for (i, file) in data.split(|&b| b == 0xF5).take(8).enumerate() {
        let Some((&how, body)) = file.split_first() else { continue };
        let (path, magic) = match how % 4 {
            0 => (format!("wal/{:020}.wal", 1 + i), Some(*b"\xA7WAL")),
            1 => (format!("blocks/{:010}.seg", 1 + i), Some(*b"\xA7BLK")),
            2 => ("index.log".to_string(), Some(*b"\xA7IDX")),
            // FORMAT is text, not frames.
            _ => ("FORMAT".to_string(), None),
        };
        let bytes = match magic {
            Some(magic) if how & 0x80 != 0 => frames(magic, body),
            _ => body.to_vec(),
        };
        let _ = timeshard_store::backend::Backend::append(&*disk, &path, &bytes);
    }
    let config = DiskConfig { fsync: timeshard_store::FsyncPolicy::OsBuffered, ..DiskConfig::default() };
    let Ok(store) = DiskStore::open_with_backend(disk, config) else { return };
    let mut after = None;
    for _ in 0..64 {
        let Ok(page) = store.list_blocks(after, 256) else { return };
        for block in &page.blocks {
            let _ = store.read_block(&block.series, block.quantum.start, None, 100_000);
        }
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let _ = store.maintain(NOW_NS);
}

/// Frames `body` as a sequence of intact frames: each chunk `len u8 | kind u8 | bytes` becomes
/// one frame with a correct checksum.
fn frames(magic: [u8; 4], mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let [len, kind, rest @ ..] = body {
        let n = usize::from(*len).min(rest.len());
        let (payload, tail) = rest.split_at(n);
        let mut framed = Vec::with_capacity(1 + n);
        framed.push(*kind);
        framed.extend_from_slice(payload);
        out.extend_from_slice(&magic);
        out.extend_from_slice(&(framed.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32c::crc32c(&framed).to_le_bytes());
        out.extend_from_slice(&framed);
        body = tail;
    }
    out
}

/// A manifest object in the archive, as a node reads it back.
pub fn tier_manifest(data: &[u8]) {
    use timeshard_tier::layout::Kind;
    let id = archive_file_id();
    archive(id.path(Kind::Manifest), data, |store| async move {
        if let Ok(manifest) = timeshard_tier::manifest::Manifest::open(&*store, &id, None).await {
            let _ = manifest.entries(&*store, None).await;
        }
    });
    #[cfg(feature = "node")]
    sealed_manifest(data);
}

/// The same bytes as a manifest in a fleet node's folder, opened by a node that checks seals:
/// the seal's parsing and checks, the footer against the sealed layout, the row groups'
/// hashes. Whatever opens was sealed by that node.
#[cfg(feature = "node")]
fn sealed_manifest(data: &[u8]) {
    use timeshard_tier::layout::Kind;
    let id = fleet::sealed_file_id();
    archive(id.path(Kind::Manifest), data, |store| async move {
        let keys = &fleet::fleet().archive;
        if let Ok(manifest) = timeshard_tier::manifest::Manifest::open(&*store, &id, Some(keys)).await {
            assert!(manifest.verified && manifest.header.node == id.node, "a manifest its folder's node did not seal");
            let _ = manifest.entries(&*store, None).await;
        }
    });
}

/// A points file in the archive: its footer, page index and every column of every row group.
pub fn tier_points(data: &[u8]) {
    use parquet::data_type::{ByteArrayType, DoubleType, Int64Type};
    use timeshard_tier::layout::Kind;
    use timeshard_tier::read::{ParquetFile, Span};
    use timeshard_tier::schema::points as col;
    let path = archive_file_id().path(Kind::Points);
    archive(path.clone(), data, |store| async move {
        let Ok(file) = ParquetFile::open(&*store, &path).await else { return };
        for rg in 0..file.meta.num_row_groups().min(16) {
            let rows = file.meta.row_group(rg).num_rows().clamp(0, 1 << 20) as usize;
            let span = Span { rg, start: 0, end: rows };
            let Ok(pages) = file.fetch(&*store, &span, &[col::SERIES_KEY, col::TIMESTAMP, col::VALUE]).await else {
                continue;
            };
            let _ = file.decode::<ByteArrayType>(&pages, &span, col::SERIES_KEY);
            let _ = file.decode::<Int64Type>(&pages, &span, col::TIMESTAMP);
            let _ = file.decode::<DoubleType>(&pages, &span, col::VALUE);
        }
    });
}

pub(crate) fn archive_file_id() -> timeshard_tier::FileId {
    let day = timeshard_tier::Day::parse("2023-11-14").expect("a valid day");
    timeshard_tier::FileId { class: "pmu".into(), day, node: "n1".into(), seq: 1, legacy: false }
}

/// The archive reader catches panics inside the parquet crate's decoders and answers a
/// corrupt-file error (`timeshard_tier::read::ParquetFile::decode`), but libFuzzer's panic hook
/// aborts before anything unwinds. This hook lets panics raised in the parquet crate unwind, so
/// that the reader's guard sees them as it does in the node; one that nothing catches still
/// reaches libfuzzer-sys's own `catch_unwind`, which aborts and reports it. Every other panic
/// (the project's own code included) goes to libFuzzer's hook at once.
fn let_parquet_decoder_panics_unwind() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let fuzzer = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let in_parquet = info.location().is_some_and(|l| l.file().replace('\\', "/").contains("/parquet-"));
            if !in_parquet {
                fuzzer(info);
            }
        }));
    });
}

/// Puts `data` at `path` in an in-memory object store and runs `read` over it.
fn archive<F, Fut>(path: object_store::path::Path, data: &[u8], read: F)
where
    F: FnOnce(Arc<dyn object_store::ObjectStore>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let_parquet_decoder_panics_unwind();
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
    runtime.block_on(async {
        let store: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        object_store::ObjectStoreExt::put(&*store, &path, bytes::Bytes::copy_from_slice(data).into())
            .await
            .expect("the memory store takes it");
        read(store).await;
    });
}

/// A certificate signing request as a device sends it at enrollment.
pub fn csr(data: &[u8]) {
    let _ = timeshard_control::ca::parse_csr(&String::from_utf8_lossy(data));
}

/// JSON bodies the control plane and the node decode from each other: the first byte picks the
/// type.
pub fn control_json(data: &[u8]) {
    use timeshard_control_api::api;
    let Some((&which, body)) = data.split_first() else { return };
    match which % 6 {
        0 => drop(serde_json::from_slice::<api::EnrollRequest>(body)),
        1 => drop(serde_json::from_slice::<api::Report>(body)),
        2 => drop(serde_json::from_slice::<api::RenewRequest>(body)),
        3 => drop(serde_json::from_slice::<timeshard_control_api::state::DesiredState>(body)),
        4 => drop(serde_json::from_slice::<api::PutClasses>(body)),
        _ => drop(serde_json::from_slice::<api::CreateHttpToken>(body)),
    }
}

/// An uploaded policy module, checked as the control plane checks it before signing.
pub fn policy_module(data: &[u8]) {
    let Some((&which, module)) = data.split_first() else { return };
    let kind = if which & 1 == 0 { timeshard_policy::Kind::Ingest } else { timeshard_policy::Kind::Query };
    let _ = timeshard_policy::component::inspect(module, kind);
}

/// The revoked-versions file (`<data_dir>/policy-floors.json`) as a node reads it at start:
/// whatever it holds, every policy is either admitted or refused, never a panic.
pub fn policy_floors(data: &[u8]) {
    let dir = tempfile_dir();
    let path = dir.join("policy-floors.json");
    if std::fs::write(&path, data).is_err() {
        return;
    }
    if let Ok(floors) = timeshard_policy::floors::Floors::open(&path) {
        for version in ["0.0.1", "1.3.0", "99.0.0", "latest"] {
            if let Ok(policy) = timeshard_policy::PolicyRef::new("pmu-validate", version) {
                let _ = floors.admit(&policy);
            }
        }
    }
}

/// A directory of this process for targets that must read a file.
fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("timeshard-fuzz-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// Signature and key files as a node reads them.
pub fn policy_signature(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = timeshard_policy::signing::Signature::from_text(&text);
    let _ = timeshard_policy::signing::PublicKey::from_text(&text);
}

/// A node's configuration file, parsed and validated as `timeshard node --config` reads it.
#[cfg(feature = "node")]
pub fn node_config(data: &[u8]) {
    use timeshard_node::config::NodeConfig;
    let Ok(text) = std::str::from_utf8(data) else { return };
    let path = std::path::Path::new("/etc/timeshard/node.toml");
    let Ok(cfg) = NodeConfig::parse(text, path) else { return };
    // What validates prints back (`--print-config`) to a file that reads as the same settings.
    let printed = toml::to_string(&cfg).expect("a valid configuration prints");
    let again = NodeConfig::parse(&printed, path).expect("a printed configuration reads back");
    assert_eq!(toml::to_string(&again).expect("it prints"), printed);
}

/// A peer's membership entry, decoded and checked as a node checks gossip before merging it
/// (certificate chain to the fleet CA, a node's certificate whose key hashes to the entry's id,
/// the signature, the incarnation bound). Whatever is accepted speaks for its own node only.
#[cfg(feature = "node")]
pub fn gossip_entry(data: &[u8]) {
    use timeshard_proto::membership::GossipEntry;
    let Ok(entry) = postcard::from_bytes::<GossipEntry>(data) else { return };
    let now = u64::try_from(NOW_NS).expect("a positive time");
    if fleet::fleet().checker.check(&entry, now).is_ok() {
        let proof = entry.proof.as_ref().expect("an accepted entry is signed");
        let cert = rustls_pki_types::CertificateDer::from(proof.chain[0].as_slice());
        let peer = timeshard_sdk::tls::PeerIdentity::of_certificate(&cert).expect("an accepted certificate reads");
        assert!(peer.is_node && peer.id == entry.member.id, "an entry accepted for a node its key is not");
    }
}
