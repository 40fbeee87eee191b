//! `/metrics`: the node's figures in Prometheus' text format. Each metric is one line below,
//! read when scraped from where it lives: the node's counters (`crate::metrics`), the store's
//! stats and files, the policy registry's call counters, the QUIC endpoint, and the node's
//! status (traffic, membership, hints, repair).
//! Names are `timeshard_<subsystem>_<what>_<unit>`, counters end in `_total`, units are base
//! units (seconds, bytes).

use std::path::Path;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use timeshard_formats::exposition::{CONTENT_TYPE, Exposition};
use timeshard_policy::Registry;
use timeshard_proto::repair::RepairStatus;
use timeshard_proto::wire::NodeStatus;
use timeshard_store::DiskStore;

use super::AppState;
use super::error::ApiError;
use crate::metrics::{Ingest, Metrics, Query, get};
use crate::node::Node;
use crate::storage::{ClassUse, DiskSpace, dir_bytes};

/// `GET /metrics`.
pub async fn scrape(State(s): State<AppState>) -> Result<Response, ApiError> {
    let node = s.node.clone();
    // The store's figures walk its index and list its files: off the async threads.
    let text = tokio::task::spawn_blocking(move || render(&node))
        .await
        .map_err(|e| ApiError::Internal(format!("metrics task failed: {e}")))?;
    Ok(([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response())
}

/// The whole exposition, in this order: the build, then what the node counts (ingest, queries,
/// HTTP), the QUIC endpoint, what the node's status reports (traffic, membership, hints,
/// replica writes, repair, the desired state in force), the disk store, and the policies.
pub fn render(node: &Node) -> String {
    let mut e = Exposition::new();
    let m = node.metrics();
    e.gauges(
        "timeshard_build_info",
        "Version of this node; always 1.",
        [(&[("version", env!("CARGO_PKG_VERSION"))][..], 1.0)],
    );
    ingest(&mut e, m);
    queries(&mut e, m);
    http(&mut e, m);
    quic(&mut e, node);
    let refused: Vec<_> = node.view().attest().refused().iter().map(|(r, n)| (r.labels(), *n as f64)).collect();
    e.counters(
        "timeshard_gossip_entries_refused_total",
        "Membership entries refused because their own node did not sign them (forged, another fleet's, a client's, or from beyond the allowed clock skew), by reason.",
        refused.iter().map(|(labels, n)| (&labels[..], *n)),
    );
    let audit = m.audit();
    let failures: Vec<_> =
        crate::audit::Door::ALL.iter().map(|d| ([("door", d.label())], audit.failures(*d) as f64)).collect();
    e.counters(
        "timeshard_auth_failures_total",
        "Credentials refused (a QUIC handshake without a certificate of the fleet CA, a revoked certificate, an HTTP request without a valid token), by door; each is logged with its source address.",
        failures.iter().map(|(labels, n)| (&labels[..], *n)),
    );
    let abandoned: Vec<_> =
        crate::audit::Door::ALL.iter().map(|d| ([("door", d.label())], m.abandoned_answers(*d) as f64)).collect();
    e.counters(
        "timeshard_abandoned_answers_total",
        "Answers given up because their caller stopped reading them (QUIC: an answer frame not taken within [dht] request_timeout, its stream reset; HTTP: no progress on the answer for [http] write_timeout, its connection closed), by door.",
        abandoned.iter().map(|(labels, n)| (&labels[..], *n)),
    );
    let revocations = node.view().revocations();
    e.gauge(
        "timeshard_revocations_generation",
        "Fleet generation of the signed revocation list this node holds (0: none), from the control plane or a peer.",
        revocations.generation() as f64,
    );
    if let Some((issued_at_ms, max_age_ms)) = revocations.issued() {
        let age = (timeshard_clock::now_ns() / 1_000_000 - issued_at_ms).max(0) as f64 / 1e3;
        e.gauge("timeshard_revocations_age_seconds", "Age of the signed revocation list this node holds.", age);
        e.gauge(
            "timeshard_revocations_stale",
            "1 when the revocation list held is older than its maximum age (it still applies).",
            flag(age * 1e3 > max_age_ms as f64),
        );
    }
    e.counter(
        "timeshard_revocations_refused_total",
        "Revocation lists refused: not signed by the fleet CA, or malformed.",
        revocations.refused() as f64,
    );
    let refusals = node.repair().refusals();
    let by_kind: Vec<_> =
        crate::peer_scope::Checked::ALL.iter().map(|k| ([("kind", k.label())], refusals.get(*k) as f64)).collect();
    e.counters(
        "timeshard_peer_requests_refused_total",
        "Requests from other nodes refused because placement gives their blocks neither to this node nor to the asker, by kind.",
        by_kind.iter().map(|(labels, n)| (&labels[..], *n)),
    );
    if let Some(archive) = node.tier().archive() {
        e.counter(
            "timeshard_archive_manifests_refused_total",
            "Archive manifests refused because their seal does not check (not sealed by the node whose folder they are in, or not by the fleet); each is logged with its path and reason once.",
            archive.refused().0 as f64,
        );
        archive_export(&mut e, node);
    }
    disk(&mut e, &node.config().data_dir);
    quotas(&mut e, &node.replica().usage().classes());
    if let Some(ms) = m.control_plane_contact_ms() {
        e.gauge(
            "timeshard_control_plane_last_contact_timestamp_seconds",
            "When the control plane last answered this node (a watch, a report or a renewal), as a Unix time; absent until it has since the node started.",
            ms as f64 / 1e3,
        );
    }
    // Replication and membership, as the node's status reports them.
    let st = node.status();
    status(&mut e, &st);
    repair(&mut e, &st.repair);
    e.gauge(
        "timeshard_config_generation",
        "Generation of the control plane's desired state in force (0: configured by hand).",
        st.config_generation as f64,
    );
    if let Some(disk) = node.disk_store() {
        store(&mut e, disk, &node.config().data_dir.join("store"));
    }
    if let Some(registry) = node.coordinator().policies() {
        policies(&mut e, registry);
    }
    e.finish()
}

/// How full the filesystem holding the node's data is. Nothing if it cannot be read.
fn disk(e: &mut Exposition, data_dir: &Path) {
    let Some(space) = DiskSpace::of(data_dir) else { return };
    e.gauge(
        "timeshard_disk_size_bytes",
        "Size of the filesystem holding the node's data directory.",
        space.size as f64,
    );
    e.gauge(
        "timeshard_disk_available_bytes",
        "Bytes of that filesystem the node may still write (unprivileged free space).",
        space.available as f64,
    );
}

/// Classes with a quota: what they hold against it, and what eviction dropped.
fn quotas(e: &mut Exposition, classes: &[ClassUse]) {
    if classes.is_empty() {
        return;
    }
    let labels: Vec<[(&str, &str); 1]> = classes.iter().map(|c| [("class", c.class.as_str())]).collect();
    let each = |f: &dyn Fn(&ClassUse) -> u64| {
        labels.iter().zip(classes).map(|(l, c)| (&l[..], f(c) as f64)).collect::<Vec<_>>()
    };
    e.gauges(
        "timeshard_class_quota_bytes",
        "A class's quota on this node's store.",
        each(&|c| c.store.max_bytes.unwrap_or(0)),
    );
    e.gauges(
        "timeshard_class_used_bytes",
        "Bytes a class holds in this node's store as maintenance last measured them (sealed blocks, and 24 bytes per point not yet sealed); writes of a class that refuses are refused at its quota.",
        each(&|c| c.bytes()),
    );
    e.counters(
        "timeshard_class_evicted_blocks_total",
        "Blocks a class with on_full = \"evict_oldest\" dropped, oldest first, to stay within its quota, since the node started.",
        each(&|c| c.store.evicted_blocks),
    );
    e.counters(
        "timeshard_class_evicted_points_total",
        "Points those evicted blocks held.",
        each(&|c| c.store.evicted_points),
    );
}

/// The export to the archive: how many blocks wait for it per class, how many rounds in a row
/// failed, and when one last succeeded (`time()` minus it is how long the archive has been out of
/// reach) or failed. Hot data is kept until archived, so the backlog is what a long outage costs.
fn archive_export(e: &mut Exposition, node: &Node) {
    let progress = node.tier().progress();
    let mut pending: Vec<(&str, u64)> = progress.classes.iter().map(|(c, n)| (c.as_str(), n.pending_blocks)).collect();
    pending.sort_unstable();
    let labels: Vec<[(&str, &str); 1]> = pending.iter().map(|(c, _)| [("class", *c)]).collect();
    e.gauges(
        "timeshard_archive_pending_blocks",
        "Blocks past their class's hot window that wait to be exported to the archive, by class.",
        labels.iter().zip(&pending).map(|(l, (_, n))| (&l[..], *n as f64)),
    );
    // In the order of `labels`: by class.
    let of = |f: fn(&crate::tier::ClassCounters) -> u64| -> Vec<f64> {
        pending.iter().map(|(c, _)| progress.classes.get(*c).map_or(0, f) as f64).collect()
    };
    e.gauges(
        "timeshard_archive_pending_points",
        "Points in the blocks waiting to be exported to the archive, by class.",
        labels.iter().zip(of(|n| n.pending_points)).map(|(l, n)| (&l[..], n)),
    );
    e.gauges(
        "timeshard_archive_pending_bytes",
        "Bytes the blocks waiting to be exported take in the hot store, by class.",
        labels.iter().zip(of(|n| n.pending_bytes)).map(|(l, n)| (&l[..], n)),
    );
    let now = timeshard_clock::now_ns();
    e.gauges(
        "timeshard_archive_behind_seconds",
        "How long the oldest block waiting for export has been due, by class (0: none waits): how far behind the archive is.",
        labels
            .iter()
            .zip(of(|n| u64::try_from(n.oldest_due_ns).unwrap_or(0)))
            .map(|(l, due)| (&l[..], if due > 0.0 { (now as f64 - due).max(0.0) / 1e9 } else { 0.0 })),
    );
    e.gauges(
        "timeshard_archive_unreadable_blocks",
        "Damaged hot blocks the last export of a class left out (kept hot), so that they do not hold back the rest.",
        labels.iter().zip(of(|n| n.unreadable_blocks)).map(|(l, n)| (&l[..], n)),
    );
    e.gauge(
        "timeshard_archive_failed_rounds",
        "Export rounds in a row that failed (0 after one succeeds); the node logs why and backs off.",
        f64::from(progress.failed_rounds),
    );
    let seconds = |ns: i64| ns as f64 / 1e9;
    if progress.last_success_ns > 0 {
        e.gauge(
            "timeshard_archive_last_success_timestamp_seconds",
            "When an export round last succeeded, as a Unix time; absent until one has since the node started.",
            seconds(progress.last_success_ns),
        );
    }
    if progress.last_error_ns > 0 {
        e.gauge(
            "timeshard_archive_last_error_timestamp_seconds",
            "When an export round last failed, as a Unix time; absent if none has since the node started.",
            seconds(progress.last_error_ns),
        );
    }
}

/// Write requests by protocol.
fn ingest(e: &mut Exposition, m: &Metrics) {
    let labels: Vec<[(&str, &str); 1]> = Ingest::ALL.iter().map(|p| [("protocol", p.label())]).collect();
    let per_protocol =
        |f: &dyn Fn(Ingest) -> f64| Ingest::ALL.iter().zip(&labels).map(|(p, l)| (&l[..], f(*p))).collect::<Vec<_>>();
    e.counters(
        "timeshard_ingest_requests_total",
        "Write requests received, by protocol.",
        per_protocol(&|p| get(&m.ingest(p).requests)),
    );
    e.counters(
        "timeshard_ingest_failed_requests_total",
        "Write requests that failed whole (nothing or not all stored).",
        per_protocol(&|p| get(&m.ingest(p).failed_requests)),
    );
    e.counters(
        "timeshard_ingest_points_total",
        "Points stored by write requests, by protocol.",
        per_protocol(&|p| get(&m.ingest(p).points)),
    );
    e.counters(
        "timeshard_ingest_rejected_total",
        "Lines, samples or points refused (malformed, invalid, or by an ingest policy).",
        per_protocol(&|p| get(&m.ingest(p).rejected)),
    );
    e.histograms(
        "timeshard_ingest_duration_seconds",
        "Time to answer a write request, by protocol.",
        Ingest::ALL.iter().zip(&labels).map(|(p, l)| (&l[..], m.ingest(*p).latency.snapshot())),
    );
}

/// Queries by kind.
fn queries(e: &mut Exposition, m: &Metrics) {
    let labels: Vec<[(&str, &str); 1]> = Query::ALL.iter().map(|k| [("kind", k.label())]).collect();
    let per_kind =
        |f: &dyn Fn(Query) -> f64| Query::ALL.iter().zip(&labels).map(|(k, l)| (&l[..], f(*k))).collect::<Vec<_>>();
    e.counters(
        "timeshard_query_requests_total",
        "Queries answered or refused, by kind.",
        per_kind(&|k| get(&m.query(k).requests)),
    );
    e.counters(
        "timeshard_query_failed_requests_total",
        "Queries that failed, by kind.",
        per_kind(&|k| get(&m.query(k).failed_requests)),
    );
    e.histograms(
        "timeshard_query_duration_seconds",
        "Time to answer a query, by kind.",
        Query::ALL.iter().zip(&labels).map(|(k, l)| (&l[..], m.query(*k).latency.snapshot())),
    );
}

/// HTTP answers and requests in flight.
fn http(e: &mut Exposition, m: &Metrics) {
    let statuses = m.http_statuses();
    let labels: Vec<[(&str, &str); 1]> = statuses.iter().map(|(c, _)| [("code", *c)]).collect();
    e.counters(
        "timeshard_http_responses_total",
        "HTTP answers, by status class.",
        labels.iter().zip(&statuses).map(|(l, (_, n))| (&l[..], *n as f64)),
    );
    e.gauge("timeshard_http_requests_in_flight", "HTTP requests being served.", m.http_in_flight() as f64);
}

/// The QUIC endpoint: connections and requests in flight.
fn quic(e: &mut Exposition, node: &Node) {
    let quic_slots = node.config().limits.max_concurrent_requests;
    e.gauge(
        "timeshard_quic_connections",
        "QUIC connections open (peers and clients).",
        node.net().endpoint().open_connections() as f64,
    );
    e.gauge(
        "timeshard_quic_requests_in_flight",
        "QUIC requests being served.",
        quic_slots.saturating_sub(node.request_slots().available_permits()) as f64,
    );
}

/// Traffic, the routing table, membership, hints and replica writes, from the node's status.
fn status(e: &mut Exposition, st: &NodeStatus) {
    e.counter(
        "timeshard_net_sent_bytes_total",
        "Message bytes sent to peers and clients (replication included).",
        st.bytes_sent as f64,
    );
    e.counter(
        "timeshard_net_received_bytes_total",
        "Message bytes received from peers and clients.",
        st.bytes_received as f64,
    );
    e.gauge("timeshard_dht_peers", "Other nodes in the routing table.", f64::from(st.peers));
    let states = [("up", st.members_up), ("down", st.members_down), ("gone", st.members_gone)];
    let labels: Vec<[(&str, &str); 1]> = states.iter().map(|(s, _)| [("state", *s)]).collect();
    e.gauges(
        "timeshard_membership_members",
        "Members of this node's membership view by state (down: silent but still owners; gone: no longer owners).",
        labels.iter().zip(&states).map(|(l, (_, n))| (&l[..], f64::from(*n))),
    );
    e.counter(
        "timeshard_membership_view_changes_total",
        "Changes of the members that own blocks.",
        st.view_generation as f64,
    );
    e.gauge("timeshard_hints_pending", "Writes held for replicas that missed them.", st.hints_pending as f64);
    e.gauge(
        "timeshard_hints_pending_bytes",
        "Bytes on disk of the writes held for replicas.",
        st.hints_pending_bytes as f64,
    );
    e.counter("timeshard_hints_replayed_total", "Held writes delivered to their replicas.", st.hints_replayed as f64);
    e.counter(
        "timeshard_hints_dropped_total",
        "Held writes dropped (too old, over the byte bound, damaged).",
        st.hints_dropped as f64,
    );
    e.gauge(
        "timeshard_replica_writes_in_flight",
        "Writes to replicas still running after their write was answered.",
        f64::from(st.replica_writes_in_flight),
    );
}

/// Anti-entropy, handoff and read repair.
fn repair(e: &mut Exposition, rp: &RepairStatus) {
    e.gauge("timeshard_repair_settled", "1 when this node holds every block it owns, else 0.", flag(rp.settled));
    e.gauge("timeshard_repair_leaving", "1 while this node hands its blocks off to leave, else 0.", flag(rp.leaving));
    e.counter("timeshard_repair_rounds_total", "Anti-entropy rounds completed.", rp.rounds as f64);
    e.counter("timeshard_repair_sessions_total", "Anti-entropy pull sessions this node ran.", rp.sessions as f64);
    e.counter(
        "timeshard_repair_sessions_served_total",
        "Anti-entropy sessions this node answered for peers.",
        rp.sessions_served as f64,
    );
    e.counter(
        "timeshard_repair_compare_bytes_total",
        "Bytes of digest comparisons (tree hashes, leaf listings) in this node's sessions.",
        rp.compare_bytes as f64,
    );
    e.counter(
        "timeshard_repair_blocks_fetched_total",
        "Blocks anti-entropy fetched into this node.",
        rp.blocks_fetched as f64,
    );
    e.counter(
        "timeshard_repair_fetched_bytes_total",
        "Bytes of the messages that fetched blocks into this node (requests and answers, as framed on the wire).",
        rp.bytes_fetched as f64,
    );
    e.gauge(
        "timeshard_repair_handoff_pending_blocks",
        "Blocks held but no longer owned at the last handoff pass.",
        rp.handoff_pending as f64,
    );
    e.counter(
        "timeshard_repair_handoff_blocks_pushed_total",
        "Blocks pushed to owners that lacked them.",
        rp.handoff_blocks_pushed as f64,
    );
    e.counter(
        "timeshard_repair_handoff_pushed_bytes_total",
        "Bytes of the messages that pushed blocks to owners that lacked them (as framed on the wire).",
        rp.handoff_bytes_pushed as f64,
    );
    e.counter(
        "timeshard_repair_handoff_blocks_dropped_total",
        "Copies dropped after every owner confirmed holding them.",
        rp.handoff_blocks_dropped as f64,
    );
    e.counter(
        "timeshard_repair_read_repairs_total",
        "Read repairs sent to replicas that lacked points.",
        rp.read_repairs_sent as f64,
    );
    e.counter(
        "timeshard_repair_read_repairs_dropped_total",
        "Read repairs dropped because the queue was full.",
        rp.read_repairs_dropped as f64,
    );
}

/// The disk store in `store_dir`: its files, open points and blocks, and how reads used them.
fn store(e: &mut Exposition, disk: &DiskStore, store_dir: &Path) {
    let st = disk.stats();
    e.gauge(
        "timeshard_store_size_bytes",
        "Bytes of sealed blocks and the index on disk.",
        (dir_bytes(&store_dir.join("blocks")) + dir_bytes(&store_dir.join("index.log"))) as f64,
    );
    e.gauge(
        "timeshard_store_log_size_bytes",
        "Bytes of the write-ahead log on disk.",
        dir_bytes(&store_dir.join("wal")) as f64,
    );
    e.gauge(
        "timeshard_store_open_points",
        "Points held in memory and the log, not yet sealed into blocks.",
        st.open_points as f64,
    );
    e.gauge(
        "timeshard_store_open_blocks",
        "Blocks holding points not yet sealed: the seal backlog.",
        st.open_blocks as f64,
    );
    e.gauge("timeshard_store_sealed_blocks", "Sealed blocks.", st.sealed_blocks as f64);
    e.gauge("timeshard_store_series", "Series in the store's dictionary.", st.series as f64);
    e.gauge("timeshard_store_log_segments", "Write-ahead log segment files.", st.wal_segments as f64);
    e.gauge("timeshard_store_block_segments", "Block segment files.", st.block_segments as f64);
    e.counter("timeshard_store_blocks_decoded_total", "Sealed blocks read and decoded.", st.blocks_decoded as f64);
    e.counter(
        "timeshard_store_blocks_sent_packed_total",
        "Sealed blocks whose compressed columns a streamed read sent on undecoded.",
        st.blocks_sent_packed as f64,
    );
    e.counter(
        "timeshard_store_summaries_used_total",
        "Block summaries that answered aggregates without decoding.",
        st.summaries_used as f64,
    );
}

/// Calls into each policy: their count, time and failures.
fn policies(e: &mut Exposition, registry: &Registry) {
    let stats = registry.call_stats();
    let labels: Vec<[(&str, &str); 3]> = stats
        .iter()
        .map(|s| {
            [("policy", s.policy.name.as_str()), ("version", s.policy.version.as_str()), ("kind", kind_label(s.kind))]
        })
        .collect();
    let rows = |f: &dyn Fn(&timeshard_policy::CallStats) -> f64| {
        stats.iter().zip(&labels).map(|(s, l)| (&l[..], f(s))).collect::<Vec<_>>()
    };
    e.counters("timeshard_policy_calls_total", "Calls into a policy.", rows(&|s| s.calls as f64));
    e.counters("timeshard_policy_call_seconds_total", "Time spent in calls into a policy.", rows(&|s| s.seconds));
    e.counters("timeshard_policy_traps_total", "Calls into a policy that trapped.", rows(&|s| s.traps as f64));
    e.counters(
        "timeshard_policy_timeouts_total",
        "Calls into a policy stopped at their deadline.",
        rows(&|s| s.timeouts as f64),
    );
    e.counters(
        "timeshard_policy_failures_total",
        "Calls into a policy that failed otherwise (limits, errors).",
        rows(&|s| s.failures as f64),
    );
}

fn flag(on: bool) -> f64 {
    if on { 1.0 } else { 0.0 }
}

fn kind_label(kind: timeshard_policy::Kind) -> &'static str {
    match kind {
        timeshard_policy::Kind::Ingest => "ingest",
        timeshard_policy::Kind::Query => "query",
    }
}
