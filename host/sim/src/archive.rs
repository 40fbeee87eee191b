//! The object store under simulation: one bucket in memory (object_store's `InMemory`) that
//! the whole fleet exports its archived class to, reached by each node through a
//! `FaultyStore` of its own, so that the plan can fail one node's requests: 5xx errors that
//! retries ride out, an outage, and uploads cut short part-way (a multipart upload whose
//! later parts fail, or whose node crashes between parts, is left incomplete). The oracle
//! reads the bucket directly at the end: points there are copies too.

use std::collections::BTreeSet;
use std::sync::Arc;

use anyhow::{Context, Result};
use timeshard_proto::{Point, SeriesClass, SeriesKey, TimeRange};
use timeshard_sdk::tls::{Identity, TlsFiles};
use timeshard_tier::faulty::{Fault, FaultyStore};
use timeshard_tier::object_store::ObjectStore;
use timeshard_tier::object_store::memory::InMemory;
use timeshard_tier::{Archive, Config};

/// The bucket and each node's way to it.
#[derive(Debug)]
pub struct Bucket {
    inner: Arc<InMemory>,
    links: Vec<Arc<FaultyStore>>,
}

/// What the plan does to one node's requests to the bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArchiveFault {
    /// Every `every`-th of the next `count` requests fails (a 5xx).
    Errors { every: u64, count: u64 },
    /// From the `after`-th next request on, every request fails until healed: an outage
    /// that cuts uploads short part-way.
    CutAfter(u64),
    /// The `after`-th next request takes effect but its answer is lost, and every later one
    /// fails until healed (the node's link dies mid-request).
    LostAnswer(u64),
}

impl Bucket {
    /// An empty bucket for `nodes` nodes.
    pub fn new(nodes: usize) -> Bucket {
        let inner = Arc::new(InMemory::new());
        let links = (0..nodes).map(|_| Arc::new(FaultyStore::new(inner.clone() as Arc<dyn ObjectStore>))).collect();
        Bucket { inner, links }
    }

    /// Node `i`'s way to the bucket.
    pub fn link(&self, i: usize) -> Arc<dyn ObjectStore> {
        self.links[i].clone()
    }

    /// Makes node `i`'s next requests fail as `fault` says.
    pub fn fail(&self, i: usize, fault: ArchiveFault) {
        let link = &self.links[i];
        let next = link.ops();
        link.set_fault(match fault {
            ArchiveFault::Errors { every, count } => {
                Fault::FailOnly((0..count).filter(|k| k % every.max(1) == 0).map(|k| next + k).collect::<BTreeSet<_>>())
            }
            ArchiveFault::CutAfter(after) => Fault::FailFrom(next + after),
            ArchiveFault::LostAnswer(after) => Fault::CrashAfter(next + after),
        });
    }

    /// Node `i`'s requests succeed again.
    pub fn heal(&self, i: usize) {
        self.links[i].set_fault(Fault::None);
    }

    /// Every point of `series` in `range` that the bucket's committed exports hold, read as
    /// a node reads them (manifests checked against the fleet CA with `tls`, a node's files).
    pub fn points(
        &self,
        tls: &TlsFiles,
        class: &SeriesClass,
        series: &SeriesKey,
        range: TimeRange,
    ) -> Result<Vec<Point>> {
        let identity = Identity::load(tls).context("the oracle's identity")?;
        let keys = timeshard_tier::seal::Keys::of(&identity).context("the oracle's keys")?;
        let config = Config { read_legacy: false, ..Config::for_node(&keys.node()) };
        let config = Config { keys: Some(Arc::new(keys)), ..config };
        let archive = Archive::with_store(self.inner.clone(), config)?;
        // Outside every simulated host: a runtime of its own, over a bucket in memory.
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
        rt.block_on(async {
            let mut out = Vec::new();
            let mut after = None;
            loop {
                let page = archive.read(class, series, range, after, 10_000).await?;
                out.extend(page.points.iter().copied());
                match (page.more, page.points.last()) {
                    (true, Some(last)) => after = Some(last.key()),
                    _ => return Ok(out),
                }
            }
        })
    }
}
