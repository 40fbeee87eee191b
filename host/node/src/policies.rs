//! The node's side of WebAssembly policies: the registry built from the `[policy]` section,
//! ingest policies on the receiving node before replication, and query policies pushed down to
//! the owners of each block (see `timeshard-policy` for the sandbox itself).

use std::sync::Arc;

use timeshard_policy::{Params, Partial, PolicyError, PolicyRef, PolicySpec, Registry};
use timeshard_proto::point::set_digest;
use timeshard_proto::wire::{
    BlockPart, ErrorCode, ErrorReply, MAX_REPORTED_REJECTIONS, PartialResult, PolicyUsage, RejectedPoint, SeriesPoints,
    Summarized,
};
use timeshard_proto::{Point, SeriesKey, TimeRange};
use timeshard_store::Store;
use tracing::warn;

use crate::config::NodeConfig;

/// The file in the data directory that keeps revoked policy versions.
pub const FLOORS_FILE: &str = "policy-floors.json";

/// Points a quantum may hold for a query policy to run over it on its owner.
const MAX_SUMMARIZE_POINTS: usize = 20_000_000;

/// Builds the registry when the configuration has a `[policy]` section with trusted keys or
/// modules, or the node is `enrolled` (the control plane may send modules at any time); a
/// module that fails to load is reported and skipped.
pub fn open(config: &NodeConfig, enrolled: bool) -> Result<Option<Arc<Registry>>, PolicyError> {
    let section = &config.policy;
    if section.modules.is_empty() && section.trusted_keys.is_empty() && !enrolled {
        return Ok(None);
    }
    let mut section = budgeted(config);
    // Revoked versions (a signature's minimum version) stay revoked across restarts.
    section.floors_file = Some(config.data_dir.join(FLOORS_FILE));
    let (registry, report) = Registry::from_config(&section, &config.base_dir)?;
    tracing::info!(
        pulley = registry.is_pulley(),
        instances = registry.limits().max_instances,
        memory_mib = registry.limits().memory_bytes >> 20,
        "policy engine started"
    );
    for (policy, error) in &report.failed {
        warn!(%policy, %error, "policy not loaded");
    }
    if let Some(error) = &report.bindings_error {
        warn!(%error, "policy bindings not applied; no series has policies until they are fixed");
    }
    Ok(Some(Arc::new(registry)))
}

/// Instances the budget aims to let run at once when neither `memory_mib` nor `max_instances`
/// is set: one call at a time would serialise every policy on a multi-core node.
const BUDGETED_INSTANCES: u64 = 4;
/// Least memory cap the budget gives an instance on its own (the 32-bit default).
const MIN_BUDGETED_MEMORY: u64 = 16 << 20;

/// The `[policy]` section with the pool sized to the memory budget's policies share: unless
/// `max_instances` is set, as many instances as fit at their memory cap (at least one, at most
/// the engine's default). Unless `memory_mib` is set too, the cap comes down (not below
/// 16 MiB) so that four instances fit: a 256 MiB budget runs 4 instances of 16 MiB.
fn budgeted(config: &NodeConfig) -> timeshard_policy::Config {
    let mut section = config.policy.clone();
    if section.max_instances.is_none() {
        let shares = crate::budget::Shares::of(config.memory.budget.0);
        if section.memory_mib.is_none() {
            let cap = section.limits().memory_bytes;
            let fitted =
                (shares.policies / BUDGETED_INSTANCES).clamp(MIN_BUDGETED_MEMORY, cap.max(MIN_BUDGETED_MEMORY));
            section.memory_mib = Some(fitted >> 20);
        }
        let limits = section.limits();
        let fit = shares.policy_instances(limits.memory_bytes);
        section.max_instances = Some(fit.min(limits.max_instances));
    }
    section
}

/// Re-applies the `[policy]` section (hot reload): new versions swap in atomically, and a
/// module that fails to load leaves the last good version running. (An enrolled node reloads
/// with the control plane's modules: `control::policies::reload`.)
pub fn reload(registry: &Registry, config: &NodeConfig) {
    let report = registry.apply(&config.policy, &config.base_dir);
    for (policy, error) in &report.failed {
        warn!(%policy, %error, "policy not reloaded; the last good version keeps running");
    }
    if let Some(error) = &report.bindings_error {
        warn!(%error, "policy bindings not changed; the previous bindings stay");
    }
    tracing::info!(running = ?registry.running().iter().map(|r| r.policy.to_string()).collect::<Vec<_>>(), "policies reloaded");
}

/// What each installed policy's calls cost, for the node's status.
pub fn usage(registry: Option<&Registry>) -> Vec<PolicyUsage> {
    let Some(registry) = registry else { return Vec::new() };
    let stats = registry.call_stats();
    registry
        .running()
        .into_iter()
        .map(|r| {
            let s = stats.iter().find(|s| s.policy == r.policy);
            PolicyUsage {
                kind: r.kind.to_string(),
                current: r.current,
                calls: s.map_or(0, |s| s.calls),
                time_us: s.map_or(0, |s| (s.seconds * 1e6) as u64),
                peak_memory_bytes: s.map_or(0, |s| s.peak_memory_bytes),
                traps: s.map_or(0, |s| s.traps),
                timeouts: s.map_or(0, |s| s.timeouts),
                failures: s.map_or(0, |s| s.failures),
                points: s.map_or(0, |s| s.points),
                rejected: s.map_or(0, |s| s.rejected),
                name: r.policy.name,
                version: r.policy.version,
            }
        })
        .collect()
}

/// The registry, or the error a request that needs policies gets on a node that runs none.
pub fn required(registry: Option<&Arc<Registry>>) -> Result<Arc<Registry>, ErrorReply> {
    registry.cloned().ok_or_else(|| {
        ErrorReply::new(
            ErrorCode::Policy,
            "this node runs no policies: configure [policy] with trusted keys, modules and bindings",
        )
    })
}

fn policy_error(code: ErrorCode, e: &PolicyError) -> ErrorReply {
    ErrorReply::new(code, e.to_string())
}

/// What ingest policies made of a batch.
#[derive(Debug, Default)]
pub struct Ingested {
    pub batch: Vec<SeriesPoints>,
    pub rejected: u64,
    pub rejections: Vec<RejectedPoint>,
}

/// Runs the ingest policy bound to each series of `batch` (on a blocking thread). A policy that
/// fails refuses the whole batch, unless it is configured to pass batches through.
pub async fn ingest(registry: Arc<Registry>, batch: Vec<SeriesPoints>) -> Result<Ingested, ErrorReply> {
    if batch.iter().all(|s| registry.ingest_policy(&s.series).is_none()) {
        return Ok(Ingested { batch, ..Ingested::default() });
    }
    let work = timeshard_clock::spawn_blocking(move || {
        let mut out = Ingested::default();
        for SeriesPoints { series, points } in batch {
            let outcome = registry.ingest(&series, points).map_err(|e| {
                ErrorReply::new(
                    ErrorCode::Rejected,
                    format!("the ingest policy of {series} refused the batch; nothing was stored: {e}"),
                )
            })?;
            out.rejected += outcome.rejected.len() as u64;
            for r in outcome.rejected {
                if out.rejections.len() < MAX_REPORTED_REJECTIONS {
                    out.rejections.push(RejectedPoint { series: series.to_string(), point: r.point, reason: r.reason });
                }
            }
            if !outcome.keep.is_empty() {
                out.batch.push(SeriesPoints { series, points: outcome.keep });
            }
        }
        Ok(out)
    });
    work.await.map_err(|e| ErrorReply::new(ErrorCode::Internal, format!("ingest policy task failed: {e}")))?
}

/// A policy partial as it crosses the network.
pub fn to_wire(p: Partial) -> PartialResult {
    PartialResult {
        policy: p.policy.name,
        version: p.policy.version,
        range: p.range,
        numbers: p.numbers,
        points: p.points,
    }
}

/// A partial off the network.
pub fn from_wire(p: PartialResult) -> Result<Partial, ErrorReply> {
    let policy = PolicyRef::new(&p.policy, &p.version).map_err(|e| policy_error(ErrorCode::Malformed, &e))?;
    Ok(Partial { policy, range: p.range, numbers: p.numbers, points: p.points })
}

/// Runs query policy `policy` over this node's raw points of `series` in each block part (its
/// share of a query), on a blocking thread. Each part reports the count and digest of the
/// points it was computed from, so the coordinator can tell whether owners agree.
pub async fn summarize(
    store: Arc<dyn Store>,
    registry: Arc<Registry>,
    series: SeriesKey,
    parts: Vec<BlockPart>,
    policy: String,
    params: Params,
) -> Result<Vec<Summarized>, ErrorReply> {
    let work = timeshard_clock::spawn_blocking(move || {
        parts
            .into_iter()
            .map(|part| {
                let points = read_all(&*store, &series, part.range, MAX_SUMMARIZE_POINTS)?;
                let partials = query_map_patiently(&registry, &policy, &series, part.range, &points, &params)?;
                Ok(Summarized { partials, points: points.len() as u64, digest: set_digest(&points) })
            })
            .collect()
    });
    work.await.map_err(|e| ErrorReply::new(ErrorCode::Internal, format!("query policy task failed: {e}")))?
}

/// Extra attempts of a query policy call that ran past its deadline.
const TIMEOUT_RETRIES: usize = 2;

/// Runs a query policy over one block part: `policy` is `name@version` (that version, or an
/// error naming the one this node runs) or a bare name (the version bound here). A call that
/// timed out is tried again, up to [`TIMEOUT_RETRIES`] times. Deadlines are wall-clock, and on a busy machine a thread can be
/// kept off the CPU past one; a policy that really loops fails every attempt. (Ingest is not
/// retried: its writer gets the refusal and may retry the idempotent write.)
fn query_map_patiently(
    registry: &Registry,
    policy: &str,
    series: &SeriesKey,
    range: TimeRange,
    points: &[Point],
    params: &Params,
) -> Result<Vec<PartialResult>, ErrorReply> {
    let spec: PolicySpec = policy.parse().map_err(|e| policy_error(ErrorCode::Malformed, &e))?;
    let mut attempt = 0;
    loop {
        match registry.query_map_version(&spec.name, spec.version.as_deref(), series, range, points, params) {
            Ok(partials) => return Ok(partials.into_iter().map(to_wire).collect()),
            Err(e @ PolicyError::Timeout { .. }) if attempt < TIMEOUT_RETRIES => {
                attempt += 1;
                warn!(%policy, %series, attempt, "query policy timed out; trying again: {e}");
            }
            Err(e) => return Err(policy_error(ErrorCode::Policy, &e)),
        }
    }
}

/// Runs query policy `policy` over points the coordinator gathered itself (when the owners'
/// partials disagreed), on a blocking thread.
pub async fn summarize_points(
    registry: Arc<Registry>,
    series: SeriesKey,
    range: TimeRange,
    points: Vec<Point>,
    policy: String,
    params: Params,
) -> Result<Vec<PartialResult>, ErrorReply> {
    let work = timeshard_clock::spawn_blocking(move || {
        query_map_patiently(&registry, &policy, &series, range, &points, &params)
    });
    work.await.map_err(|e| ErrorReply::new(ErrorCode::Internal, format!("query policy task failed: {e}")))?
}

/// Merges the partials of a whole query on the coordinator, on a blocking thread.
pub async fn merge(
    registry: Arc<Registry>,
    policy: String,
    partials: Vec<PartialResult>,
    params: Params,
) -> Result<timeshard_policy::QueryResult, ErrorReply> {
    let partials = partials.into_iter().map(from_wire).collect::<Result<Vec<_>, _>>()?;
    let work = timeshard_clock::spawn_blocking(move || {
        registry.query_merge(&policy, partials, &params).map_err(|e| policy_error(ErrorCode::Policy, &e))
    });
    work.await.map_err(|e| ErrorReply::new(ErrorCode::Internal, format!("query merge task failed: {e}")))?
}

/// Every point of `series` in `range` from the local store, refusing more than `max`.
fn read_all(store: &dyn Store, series: &SeriesKey, range: TimeRange, max: usize) -> Result<Vec<Point>, ErrorReply> {
    let mut points = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .read(series, range, after, 100_000)
            .map_err(|e| ErrorReply::new(ErrorCode::Storage, format!("this node's store failed: {e}")))?;
        after = page.points.last().map(Point::key).or(after);
        points.extend(page.points);
        if points.len() > max {
            return Err(ErrorReply::new(
                ErrorCode::Policy,
                format!("{series} holds more than {max} points in one quantum; use a shorter quantum for its class"),
            ));
        }
        if !page.more {
            return Ok(points);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::ByteSize;

    fn pool(budget: u64, policy: &str) -> (u64, u32) {
        let mut config = NodeConfig::default();
        config.memory.budget = ByteSize(budget);
        config.policy = toml::from_str(policy).unwrap();
        let limits = budgeted(&config).limits();
        (limits.memory_bytes >> 20, limits.max_instances)
    }

    #[test]
    fn the_policy_pool_is_sized_from_the_memory_budget() {
        assert_eq!(pool(256 << 20, ""), (16, 4), "the default budget: 4 instances of 16 MiB");
        let default_cap = timeshard_policy::Limits::default().memory_bytes >> 20;
        assert_eq!(pool(1 << 30, ""), (default_cap, 4), "no cap above the engine's default");
        assert_eq!(pool(4 << 20, ""), (16, 1), "at least one instance, never under 16 MiB");
        assert_eq!(pool(256 << 20, "memory_mib = 64"), (64, 1), "a set cap is kept");
        assert_eq!(pool(256 << 20, "max_instances = 10"), (default_cap, 10), "a set count is kept");
    }
}
