//! The series dictionary as the coordinator sees it: listing the series of the whole cluster,
//! and whether one series was ever written (to tell an empty range from a misspelt key).

use std::collections::BTreeSet;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use timeshard_proto::key::series_meta_id;
use timeshard_proto::wire::{ErrorReply, Request, Response, SeriesFilter};
use timeshard_proto::{Contact, SeriesKey};
use tracing::warn;

use super::{Coordinator, OWNER_PARALLELISM, bounded_in_order, unavailable};

impl Coordinator {
    /// The series of the whole cluster passing `filter`: every member of the view that owns
    /// data lists the registrations it holds (each series is registered on RF nodes), and the
    /// answers are merged. Members that are down count as failed. Fails if so many nodes failed
    /// to answer that a series could be missing.
    pub async fn list_series(&self, filter: SeriesFilter, limit: u32) -> Result<(Vec<SeriesKey>, bool), ErrorReply> {
        let (nodes, down): (Vec<Contact>, Vec<Contact>) =
            self.view.eligible().into_iter().partition(|c| self.view.is_up(&c.id));
        let ask = |c: Contact| {
            let req = Request::FindSeries { filter: filter.clone(), limit };
            async move { self.replica_call(&c, req).await }
        };
        let answers = bounded_in_order(nodes.iter().map(|c| ask(*c)).collect(), OWNER_PARALLELISM).await;
        let mut all = BTreeSet::new();
        let mut more = false;
        let mut failed: Vec<String> = down.iter().map(|c| format!("{}: down", c.addr)).collect();
        for (node, answer) in nodes.iter().zip(answers) {
            match answer {
                Ok(Response::SeriesList { series, more: m }) => {
                    more |= m;
                    all.extend(series);
                }
                Ok(other) => failed.push(format!("{}: unexpected answer {other:?}", node.addr)),
                Err(e) => failed.push(format!("{}: {}", node.addr, e.message)),
            }
        }
        let min_rf = self.classes().iter().map(|c| c.replication.rf).min().unwrap_or(1) as usize;
        if failed.len() >= min_rf {
            return Err(unavailable(format!(
                "{} nodes did not answer, so the list could miss series: {}",
                failed.len(),
                failed.join("; ")
            )));
        }
        more |= all.len() > limit as usize;
        Ok((all.into_iter().take(limit as usize).collect(), more))
    }

    /// Whether `series` is registered in the series dictionary.
    pub(super) async fn series_known(&self, series: &SeriesKey) -> Result<bool, ErrorReply> {
        if self.registered.lock().expect("registered lock").contains(series) {
            return Ok(true);
        }
        let target = self.target(series, series_meta_id(series), self.classes().of(series))?;
        let replicas = self.view.owners_of(&target).owners;
        let mut asks: FuturesUnordered<_> =
            replicas.iter().map(|c| self.replica_call(c, Request::HasSeries { series: series.clone() })).collect();
        let mut answered = 0;
        while let Some(result) = asks.next().await {
            match result {
                Ok(Response::SeriesKnown { known: true }) => {
                    self.registered.lock().expect("registered lock").insert(series.clone());
                    return Ok(true);
                }
                Ok(_) => answered += 1,
                Err(e) => warn!(%series, error = %e.message, "series dictionary replica did not answer"),
            }
        }
        if answered == 0 {
            return Err(unavailable(format!("no replica of the series dictionary answered for {series}")));
        }
        Ok(false)
    }
}
