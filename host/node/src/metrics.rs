//! What the node counts about the work it does, for `/metrics`: ingest and queries by protocol
//! and kind (requests, points, errors, latency histograms), and HTTP requests by status class.
//! Recording is a few relaxed atomic adds; figures owned elsewhere (the store's stats, the
//! policy registry's call counters, traffic) are read when `/metrics` is scraped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use timeshard_formats::exposition::HistogramSnapshot;
use timeshard_proto::wire::{Request, Response};

/// Upper bounds of the latency buckets, in seconds: 0.5 ms to 10 s.
pub const LATENCY_BUCKETS: [f64; 14] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// A latency histogram, updated without locks.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last is above every bound.
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_ns: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = LATENCY_BUCKETS.iter().position(|&le| secs <= le).unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Cumulative counts per bound, as the exposition format wants them.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut cumulative = 0;
        let buckets = LATENCY_BUCKETS
            .iter()
            .zip(&self.buckets)
            .map(|(&le, n)| {
                cumulative += n.load(Ordering::Relaxed);
                (le, cumulative)
            })
            .collect();
        let count = cumulative + self.buckets[LATENCY_BUCKETS.len()].load(Ordering::Relaxed);
        HistogramSnapshot { buckets, sum: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9, count }
    }
}

/// Where points come in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ingest {
    /// The SDK's writes over QUIC.
    Quic,
    LineProtocol,
    RemoteWrite,
}

impl Ingest {
    pub const ALL: [Ingest; 3] = [Ingest::Quic, Ingest::LineProtocol, Ingest::RemoteWrite];

    pub fn label(self) -> &'static str {
        match self {
            Ingest::Quic => "quic",
            Ingest::LineProtocol => "line_protocol",
            Ingest::RemoteWrite => "remote_write",
        }
    }
}

/// What a query asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Query {
    Read,
    Aggregate,
    Policy,
    Series,
    Latest,
    InfluxQl,
    PromQl,
}

impl Query {
    pub const ALL: [Query; 7] =
        [Query::Read, Query::Aggregate, Query::Policy, Query::Series, Query::Latest, Query::InfluxQl, Query::PromQl];

    pub fn label(self) -> &'static str {
        match self {
            Query::Read => "read",
            Query::Aggregate => "aggregate",
            Query::Policy => "policy",
            Query::Series => "series",
            Query::Latest => "latest",
            Query::InfluxQl => "influxql",
            Query::PromQl => "promql",
        }
    }
}

/// Counters of one ingest protocol.
#[derive(Debug, Default)]
pub struct IngestCounters {
    pub requests: AtomicU64,
    pub failed_requests: AtomicU64,
    pub points: AtomicU64,
    /// Points or lines refused: malformed, invalid, or refused by an ingest policy.
    pub rejected: AtomicU64,
    pub latency: Histogram,
}

/// Counters of one kind of query.
#[derive(Debug, Default)]
pub struct QueryCounters {
    pub requests: AtomicU64,
    pub failed_requests: AtomicU64,
    pub latency: Histogram,
}

/// The node's counters.
#[derive(Debug, Default)]
pub struct Metrics {
    ingest: [IngestCounters; 3],
    queries: [QueryCounters; Query::ALL.len()],
    /// HTTP answers by status class: 2xx, 3xx, 4xx, 5xx (1xx is not answered).
    http_status: [AtomicU64; 4],
    http_in_flight: AtomicU64,
    /// Answers given up because their caller stopped reading them: QUIC, HTTP.
    abandoned_answers: [AtomicU64; 2],
    audit: crate::audit::Audit,
    /// When the control plane last answered this node (Unix milliseconds; 0: not since start).
    control_plane_contact_ms: AtomicU64,
}

impl Metrics {
    /// Failed authentications, counted and logged with their source.
    pub fn audit(&self) -> &crate::audit::Audit {
        &self.audit
    }

    pub fn ingest(&self, protocol: Ingest) -> &IngestCounters {
        &self.ingest[protocol as usize]
    }

    pub fn query(&self, kind: Query) -> &QueryCounters {
        &self.queries[kind as usize]
    }

    /// Records one write: points stored, points refused, whether it failed, how long it took.
    pub fn record_ingest(&self, protocol: Ingest, points: u64, rejected: u64, ok: bool, took: Duration) {
        let c = self.ingest(protocol);
        c.requests.fetch_add(1, Ordering::Relaxed);
        c.points.fetch_add(points, Ordering::Relaxed);
        c.rejected.fetch_add(rejected, Ordering::Relaxed);
        if !ok {
            c.failed_requests.fetch_add(1, Ordering::Relaxed);
        }
        c.latency.observe(took);
    }

    /// Records one query.
    pub fn record_query(&self, kind: Query, ok: bool, took: Duration) {
        let c = self.query(kind);
        c.requests.fetch_add(1, Ordering::Relaxed);
        if !ok {
            c.failed_requests.fetch_add(1, Ordering::Relaxed);
        }
        c.latency.observe(took);
    }

    /// Records an HTTP answer's status.
    pub fn record_http_status(&self, status: u16) {
        if let Some(c) = self.http_status.get(usize::from(status / 100).wrapping_sub(2)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// HTTP answers by status class, as (label, count).
    pub fn http_statuses(&self) -> [(&'static str, u64); 4] {
        let n = |i: usize| self.http_status[i].load(Ordering::Relaxed);
        [("2xx", n(0)), ("3xx", n(1)), ("4xx", n(2)), ("5xx", n(3))]
    }

    /// HTTP requests being served; the guard ends one.
    pub fn http_request_started(&self) -> InFlight<'_> {
        self.http_in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(&self.http_in_flight)
    }

    pub fn http_in_flight(&self) -> u64 {
        self.http_in_flight.load(Ordering::Relaxed)
    }

    /// Counts an answer given up at `door`: its caller took none of it for the write timeout.
    pub fn record_abandoned_answer(&self, door: crate::audit::Door) {
        self.abandoned_answers[door as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Notes that the control plane answered (a watch, a report or a renewal) at `now_ms`.
    pub fn record_control_plane_contact(&self, now_ms: u64) {
        self.control_plane_contact_ms.fetch_max(now_ms, Ordering::Relaxed);
    }

    /// When the control plane last answered (Unix milliseconds), if it has since the node started.
    pub fn control_plane_contact_ms(&self) -> Option<u64> {
        Some(self.control_plane_contact_ms.load(Ordering::Relaxed)).filter(|&ms| ms > 0)
    }

    /// Answers given up at `door` so far.
    pub fn abandoned_answers(&self, door: crate::audit::Door) -> u64 {
        self.abandoned_answers[door as usize].load(Ordering::Relaxed)
    }
}

/// A client request over QUIC that the metrics count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counted {
    Ingest,
    Query(Query),
}

impl Counted {
    /// What `req` counts as, if it is a client's write or query.
    pub fn of(req: &Request) -> Option<Counted> {
        Some(match req {
            Request::Write { .. } => Counted::Ingest,
            Request::Read { .. } | Request::Latest { .. } => Counted::Query(Query::Read),
            Request::Aggregate { .. } => Counted::Query(Query::Aggregate),
            Request::Query { .. } => Counted::Query(Query::Policy),
            Request::ListSeries { .. } => Counted::Query(Query::Series),
            _ => return None,
        })
    }
}

impl Metrics {
    /// Records a client request over QUIC and its answer.
    pub fn record_quic(&self, counted: Counted, resp: &Response, took: Duration) {
        let ok = !matches!(resp, Response::Error(_));
        match (counted, resp) {
            (Counted::Ingest, Response::Written { points, rejected, .. }) => {
                self.record_ingest(Ingest::Quic, *points, *rejected, true, took)
            }
            (Counted::Ingest, _) => self.record_ingest(Ingest::Quic, 0, 0, ok, took),
            (Counted::Query(kind), _) => self.record_query(kind, ok, took),
        }
    }
}

/// Ends an in-flight request when dropped.
#[derive(Debug)]
pub struct InFlight<'a>(&'a AtomicU64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Reads a counter.
pub fn get(c: &AtomicU64) -> f64 {
    c.load(Ordering::Relaxed) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_sum_in_seconds() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(100));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(60));
        let s = h.snapshot();
        assert_eq!(s.count, 3);
        assert_eq!(s.buckets[0], (0.0005, 1));
        assert_eq!(s.buckets[3], (0.005, 2));
        assert_eq!(s.buckets.last(), Some(&(10.0, 2)));
        assert!((s.sum - 60.0031).abs() < 1e-9, "{}", s.sum);
    }

    #[test]
    fn records_land_in_their_protocol_and_class() {
        let m = Metrics::default();
        m.record_ingest(Ingest::LineProtocol, 10, 2, true, Duration::from_millis(1));
        m.record_query(Query::InfluxQl, false, Duration::from_millis(1));
        m.record_http_status(204);
        m.record_http_status(503);
        m.record_http_status(101);
        assert_eq!(get(&m.ingest(Ingest::LineProtocol).points), 10.0);
        assert_eq!(get(&m.ingest(Ingest::Quic).points), 0.0);
        assert_eq!(get(&m.query(Query::InfluxQl).failed_requests), 1.0);
        assert_eq!(m.http_statuses(), [("2xx", 1), ("3xx", 0), ("4xx", 0), ("5xx", 1)]);
        {
            let _a = m.http_request_started();
            assert_eq!(m.http_in_flight(), 1);
        }
        assert_eq!(m.http_in_flight(), 0);
    }
}
