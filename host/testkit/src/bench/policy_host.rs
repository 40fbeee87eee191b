//! The in-process part of `timeshard bench policy`: what WebAssembly policies cost in the
//! policy host, as specified in shared/BENCHMARKS.md. Run it from a release build; it measures
//! and never asserts.
//!
//! What each figure measures (medians over `repetitions` unless said otherwise):
//! - `ns_per_point.native`: the ingest path with no policy: validating a 1,000-point `pmu`
//!   batch natively (drop NaN, infinities and out-of-range values, sort, deduplicate), per
//!   point, including the copy of the batch that the policy path makes too.
//! - `ns_per_point.wasm_validate` / `wasm_deadband`: the same batches through
//!   [`Registry::ingest`] with `pmu-validate` / `deadband` (`d = 0.5`) bound: a fresh pooled
//!   instance per batch, the batch lowered into the guest, the policy, the result lifted and
//!   checked. The policy overhead is `wasm_validate - native`.
//! - `call_overhead_ns`: one [`Registry::ingest`] of a 1,000-point batch through `noop`, a
//!   policy that returns its input: the fixed cost of a call plus moving 1,000 points in and
//!   out.
//! - `instantiate_us`: one pooled instance of a cached component, created and dropped.
//! - `loop_stop_ms_p99`: a guest that loops forever under the default 10 ms deadline: the
//!   99th percentile of (time the call returned - its deadline), over `loop_samples` calls.
//! - `pushdown`: RMS over one day of one `pmu` series, 10 s quanta. Here measured in one
//!   process (`"scope": "single-process"`): `bytes_*` are the postcard-encoded bytes that would
//!   cross the network (the partials vs the raw points), `ms_*` the time to encode, decode and
//!   compute (summarize on each quantum + merge, vs encode the raw points + decode + a native
//!   RMS). The cluster figure (QUIC, owner nodes) is filled in by the cluster side of the benchmark (`bench::policy`).

use std::path::Path;
use std::time::Instant;

use serde::Serialize;
use timeshard_policy::signing::{self, TrustedKeys};
use timeshard_policy::{
    Binding, Bindings, Kind, Limits, Module, Params, Partial, PolicyError, PolicyRef, Registry, Settings,
};
use timeshard_proto::time::quanta;
use timeshard_proto::{Point, QuantumLen, SeriesKey, TimeRange};

use crate::datasets::{T0, pmu, pmu_series};
use crate::stats::{median, percentile};

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Batches of 1,000 points per repetition of the ingest figures.
    pub batches: usize,
    /// Repetitions; the median is reported.
    pub repetitions: usize,
    /// Calls of the looping guest for `loop_stop_ms_p99`.
    pub loop_samples: usize,
    /// Seconds of data for the push-down figure (one day by default).
    pub pushdown_seconds: i64,
    /// The engine's limits. The looping guest always runs under the default 10 ms deadline.
    pub limits: Limits,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            batches: 100,
            repetitions: 15,
            loop_samples: 100,
            pushdown_seconds: 86_400,
            limits: Limits::default(),
        }
    }
}

/// The benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{0}")]
    Policy(#[from] PolicyError),
    #[error("cannot encode the push-down messages: {0}")]
    Encode(#[from] postcard::Error),
    #[error("setting up the benchmark failed: {0}")]
    Setup(String),
}

/// `ns_per_point` of the report.
#[derive(Clone, Debug, Serialize)]
pub struct NsPerPoint {
    pub native: f64,
    pub wasm_validate: f64,
    pub wasm_deadband: f64,
}

/// `pushdown` of the report.
#[derive(Clone, Debug, Serialize)]
pub struct Pushdown {
    pub policy: String,
    pub span: String,
    pub bytes_pushdown: u64,
    pub bytes_raw: u64,
    pub ms_pushdown: f64,
    pub ms_raw: f64,
    /// Where it was measured: `single-process` here; the node's cluster benchmark replaces it.
    pub scope: String,
    /// Points in the span and partials sent (extra keys, for reading the figures).
    pub points: u64,
    pub partials: u64,
}

/// The JSON document of `timeshard bench policy`, with exactly the keys of BENCHMARKS.md.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyBenchReport {
    pub ns_per_point: NsPerPoint,
    pub call_overhead_ns: f64,
    pub instantiate_us: f64,
    pub loop_stop_ms_p99: f64,
    pub pushdown: Option<Pushdown>,
}

/// The native ingest path the policies are compared with: what `pmu-validate` does, in Rust.
pub fn native_validate(batch: Vec<Point>, min: f64, max: f64) -> (Vec<Point>, Vec<(usize, &'static str)>) {
    let mut keep = Vec::with_capacity(batch.len());
    let mut rejected = Vec::new();
    for (i, p) in batch.into_iter().enumerate() {
        if p.value.is_nan() {
            rejected.push((i, "value is NaN"));
        } else if p.value.is_infinite() {
            rejected.push((i, "value is infinite"));
        } else if p.value < min || p.value > max {
            rejected.push((i, "value is out of range"));
        } else {
            keep.push(p);
        }
    }
    timeshard_proto::point::sort_dedup(&mut keep);
    (keep, rejected)
}

/// Deadline of the guests whose cost is measured (the looping guest keeps the default).
const MEASURED_DEADLINE_MS: u64 = 1_000;

/// A registry trusting a fresh key, and that key.
struct Bench {
    key: signing::SecretKey,
    registry: Registry,
    guest_dir: std::path::PathBuf,
}

impl Bench {
    fn install(
        &self,
        guest: &str,
        kind: Kind,
        config: &[(&str, &str)],
        deadline_ms: Option<u64>,
    ) -> Result<PolicyRef, BenchError> {
        let bytes = std::fs::read(timeshard_policy::guest_artifact(&self.guest_dir, guest)?)
            .map_err(|e| BenchError::Setup(format!("reading guest {guest}: {e}")))?;
        let policy = PolicyRef::new(guest, "1.0.0")?;
        let signature = signing::sign(&self.key, &bytes, &signing::Identity::new(policy.clone(), kind)).to_text();
        let module = Module {
            policy,
            kind,
            signature: Some(signature),
            wasm: bytes,
            settings: Settings {
                config: config.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                deadline_ms,
                ..Settings::default()
            },
        };
        Ok(self.registry.install(module)?)
    }

    /// Binds `guest` as the ingest policy of every series.
    fn bind_ingest(&self, guest: &str) -> Result<(), BenchError> {
        Ok(self.registry.bind(Bindings(vec![Binding {
            ingest: Some(guest.parse()?),
            query: vec!["rms".parse()?],
            ..Binding::default()
        }]))?)
    }

    /// Median ns per point of `registry.ingest` over `batches`.
    fn ingest_ns_per_point(&self, series: &SeriesKey, batches: &[Vec<Point>], reps: usize) -> Result<f64, BenchError> {
        let points: usize = batches.iter().map(Vec::len).sum();
        let mut samples = Vec::with_capacity(reps);
        // One untimed pass warms the pool slots and caches.
        for b in batches.iter().take(10) {
            self.registry.ingest(series, b.clone())?;
        }
        for _ in 0..reps {
            let start = Instant::now();
            for b in batches {
                std::hint::black_box(self.registry.ingest(series, b.clone())?);
            }
            samples.push(start.elapsed().as_nanos() as f64 / points as f64);
        }
        Ok(median(&samples))
    }
}

/// Runs the benchmark with the guests built under `guest_dir` (see guest/build.sh).
pub fn run(guest_dir: &Path, opts: &Options) -> Result<PolicyBenchReport, BenchError> {
    let key = signing::generate_keypair().map_err(|e| BenchError::Setup(e.to_string()))?;
    let registry = Registry::new(opts.limits.clone(), TrustedKeys::new([key.public()]))?;
    let bench = Bench { key, registry, guest_dir: guest_dir.to_path_buf() };
    // The guests measured get a generous deadline: on a loaded machine a preempted call can
    // outlive the default 10 ms, and the figures are about cost, not about deadlines.
    let relaxed = Some(MEASURED_DEADLINE_MS);
    bench.install("pmu-validate", Kind::Ingest, &[], relaxed)?;
    bench.install("deadband", Kind::Ingest, &[("d", "0.5")], relaxed)?;
    bench.install("noop", Kind::Ingest, &[], relaxed)?;
    let loop_deadline = Limits::default().deadline;
    let loop_ms = loop_deadline.as_millis() as u64;
    bench.install("hostile-loop", Kind::Ingest, &[], Some(loop_ms))?;
    let rms = bench.install("rms", Kind::Query, &[], relaxed)?;

    let series = pmu_series(0);
    let all: Vec<Point> = pmu(0).take(opts.batches.max(1) * 1000).collect();
    let batches: Vec<Vec<Point>> = all.chunks(1000).map(<[Point]>::to_vec).collect();
    let reps = opts.repetitions.max(1);

    // Native: the same work, the same copy of each batch.
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        for b in &batches {
            std::hint::black_box(native_validate(b.clone(), -1e6, 1e6));
        }
        samples.push(start.elapsed().as_nanos() as f64 / all.len() as f64);
    }
    let native = median(&samples);

    bench.bind_ingest("pmu-validate")?;
    let wasm_validate = bench.ingest_ns_per_point(&series, &batches, reps)?;
    bench.bind_ingest("deadband")?;
    let wasm_deadband = bench.ingest_ns_per_point(&series, &batches, reps)?;
    bench.bind_ingest("noop")?;
    let call_overhead_ns = bench.ingest_ns_per_point(&series, &batches, reps)? * 1000.0;

    // Instantiation alone.
    let noop = PolicyRef::new("noop", "1.0.0")?;
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        let n = 1000;
        let start = Instant::now();
        for _ in 0..n {
            bench.registry.instantiate_once(&noop)?;
        }
        samples.push(start.elapsed().as_nanos() as f64 / n as f64 / 1000.0);
    }
    let instantiate_us = median(&samples);

    // A loop stopped at its deadline.
    bench.bind_ingest("hostile-loop")?;
    let deadline = loop_deadline;
    let one = &batches[0];
    let mut late = Vec::with_capacity(opts.loop_samples);
    for _ in 0..opts.loop_samples.max(1) {
        let start = Instant::now();
        match bench.registry.ingest(&series, one.clone()) {
            Err(PolicyError::Timeout { .. }) => {}
            other => {
                return Err(BenchError::Setup(format!("the looping guest was not stopped by its deadline: {other:?}")));
            }
        }
        let elapsed = start.elapsed();
        late.push(elapsed.saturating_sub(deadline).as_secs_f64() * 1e3);
    }
    let loop_stop_ms_p99 = percentile(&late, 99.0);

    let pushdown =
        if opts.pushdown_seconds > 0 { Some(pushdown(&bench.registry, &rms, opts.pushdown_seconds)?) } else { None };

    Ok(PolicyBenchReport {
        ns_per_point: NsPerPoint { native, wasm_validate, wasm_deadband },
        call_overhead_ns,
        instantiate_us,
        loop_stop_ms_p99,
        pushdown,
    })
}

/// RMS over `seconds` of one `pmu` series in 10 s quanta: summarized per quantum and merged,
/// vs every raw point shipped and reduced natively. Both sides encode and decode their
/// messages with postcard, as the wire does.
fn pushdown(registry: &Registry, rms: &PolicyRef, seconds: i64) -> Result<Pushdown, BenchError> {
    let series = pmu_series(0);
    let n = (seconds * 60) as usize;
    let points: Vec<Point> = pmu(0).take(n).collect();
    let range = TimeRange::new(T0, T0 + seconds * 1_000_000_000).map_err(|e| BenchError::Setup(e.to_string()))?;
    // Each quantum's points, as the owners' stores would hand them over.
    let mut per_quantum: Vec<(TimeRange, &[Point])> = Vec::new();
    let mut rest = &points[..];
    for (_, part) in quanta(range, QuantumLen::DEFAULT) {
        let k = rest.iter().take_while(|p| part.contains(p.ts)).count();
        per_quantum.push((part, &rest[..k]));
        rest = &rest[k..];
    }
    let params = Params::new();

    let start = Instant::now();
    let mut bytes_pushdown = 0u64;
    let mut received: Vec<Partial> = Vec::with_capacity(per_quantum.len());
    for (part, raw) in &per_quantum {
        let partials = registry.query_map(&rms.name, &series, *part, raw, &params)?;
        let wire = postcard::to_allocvec(&partials)?;
        bytes_pushdown += wire.len() as u64;
        received.extend(postcard::from_bytes::<Vec<Partial>>(&wire)?);
    }
    let result = registry.query_merge(&rms.name, received, &params)?;
    let ms_pushdown = start.elapsed().as_secs_f64() * 1e3;

    let start = Instant::now();
    let mut bytes_raw = 0u64;
    let (mut sum_sq, mut count) = (0.0f64, 0u64);
    for (_, raw) in &per_quantum {
        let wire = postcard::to_allocvec(raw)?;
        bytes_raw += wire.len() as u64;
        for p in postcard::from_bytes::<Vec<Point>>(&wire)? {
            if p.value.is_finite() {
                sum_sq += p.value * p.value;
                count += 1;
            }
        }
    }
    let native_rms = (sum_sq / count as f64).sqrt();
    let ms_raw = start.elapsed().as_secs_f64() * 1e3;

    // The two must agree, or the figure means nothing.
    let pushed = result.value("rms").unwrap_or(f64::NAN);
    if (pushed - native_rms).abs() > 1e-9 * native_rms.abs().max(1.0) {
        return Err(BenchError::Setup(format!("push-down RMS {pushed} differs from the raw RMS {native_rms}")));
    }
    Ok(Pushdown {
        policy: "rms".into(),
        span: if seconds == 86_400 { "1d".into() } else { format!("{seconds}s") },
        bytes_pushdown,
        bytes_raw,
        ms_pushdown,
        ms_raw,
        scope: "single-process".into(),
        points: n as u64,
        partials: per_quantum.len() as u64,
    })
}

/// A short human summary of a report.
pub fn summary(r: &PolicyBenchReport) -> String {
    let mut s = format!(
        "ns/point: native {:.1}, pmu-validate {:.1}, deadband {:.1} (overhead {:.1})\n\
         call (1,000 points, noop) {:.0} ns, instantiate {:.2} us, loop stopped {:.2} ms after its deadline (p99)\n",
        r.ns_per_point.native,
        r.ns_per_point.wasm_validate,
        r.ns_per_point.wasm_deadband,
        r.ns_per_point.wasm_validate - r.ns_per_point.native,
        r.call_overhead_ns,
        r.instantiate_us,
        r.loop_stop_ms_p99,
    );
    if let Some(p) = &r.pushdown {
        s.push_str(&format!(
            "push-down rms over {} ({}): {} bytes vs {} raw ({:.0}x fewer), {:.1} ms vs {:.1} ms\n",
            p.span,
            p.scope,
            p.bytes_pushdown,
            p.bytes_raw,
            p.bytes_raw as f64 / p.bytes_pushdown.max(1) as f64,
            p.ms_pushdown,
            p.ms_raw
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_validation_matches_the_guest_semantics() {
        let mut batch = vec![Point::new(3, 1.0), Point::new(1, f64::NAN), Point::new(2, 5.0), Point::new(3, 1.0)];
        batch.push(Point::new(0, f64::INFINITY));
        let (keep, rejected) = native_validate(batch, -2.0, 2.0);
        assert_eq!(keep, vec![Point::new(3, 1.0)]);
        assert_eq!(rejected.len(), 3);
    }
}
