//! What a run recorded: the operations clients invoked and what they saw, the faults applied,
//! and the oracle's looks at every replica. The checker (`crate::check`) reads only this.
//!
//! A history renders to text one event a line ([`History::text`]); two runs of a seed must
//! render the same bytes, which is how determinism is checked.

use std::fmt::Write as _;

use serde::Serialize;

/// A point as the history names it: (timestamp, event id).
pub type Pt = (i64, u64);

/// One thing that happened, at simulation time `t` (ns).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum Event {
    /// A fault or a membership change the simulator applied.
    Fault { t: u64, what: String },
    /// A client write: its points, to which nodes it was sent, and whether one acknowledged it.
    Write {
        invoked: u64,
        done: u64,
        client: usize,
        series: String,
        points: Vec<Pt>,
        attempts: u32,
        acked: bool,
        error: Option<String>,
    },
    /// A client's `latest` of a CoI series from inside its context of interest.
    Latest {
        invoked: u64,
        done: u64,
        client: usize,
        series: String,
        via: usize,
        point: Option<Pt>,
        error: Option<String>,
    },
    /// After the faults stopped and the fleet settled: every point of a series, read through a node.
    FinalRead { t: u64, series: String, via: usize, points: Vec<Pt>, error: Option<String> },
    /// After the faults stopped: aggregates of a series over windows, through a node.
    Aggregate { t: u64, series: String, via: usize, width_ns: i64, windows: Vec<Window>, error: Option<String> },
    /// The oracle's look at one block on every node whose disk holds it, and how many of its
    /// points the archive holds.
    Copies { t: u64, why: String, series: String, quantum: i64, copies: Vec<Copy>, archived: u64 },
    /// The points of a series that some running node's store or the archive holds (the oracle
    /// reads every store and the bucket directly).
    Held { t: u64, series: String, points: Vec<Pt> },
    /// A node's memory against its budget.
    Memory { t: u64, node: usize, what: String, used: u64, limit: u64 },
    /// At the end: the generation of desired state a running node runs and last reported,
    /// and the control plane's.
    Config { t: u64, node: usize, running: u64, reported: u64, latest: u64 },
    /// A node could not start, or failed in a way the simulator saw.
    NodeError { t: u64, node: usize, error: String },
    /// Totals at the end.
    Totals { t: u64, sent: u64, delivered: u64, dropped: u64, duplicated: u64, partitioned: u64 },
}

/// A window as an aggregate answered it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Window {
    pub start: i64,
    pub count: u64,
    pub sum: f64,
    pub min: f64,
    pub max: f64,
}

/// One replica's copy of a block.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Copy {
    pub node: usize,
    /// Whether the node is running (a copy on a crashed node's disk still counts as a copy).
    pub up: bool,
    pub count: u64,
    pub digest: u64,
}

/// The history of one run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct History {
    pub events: Vec<Event>,
}

impl History {
    pub fn push(&mut self, e: Event) {
        self.events.push(e);
    }

    /// One event a line; equal for two runs exactly when they did the same.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for e in &self.events {
            let _ = writeln!(out, "{e:?}");
        }
        out
    }

    /// SHA-256 of [`History::text`], hex.
    pub fn digest(&self) -> String {
        use sha2::Digest;
        let hash = sha2::Sha256::digest(self.text().as_bytes());
        hash.iter().fold(String::new(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
    }
}
