//! Where the client of the request being served said it is ([`Request::Located`]), for the
//! duration of that request: the coordinator's read plan takes it instead of the node's own
//! location when it decides whether the client is inside a series' context of interest.
//!
//! A task-local rather than a parameter, because the decision is made deep in every read path
//! (pages, streams, aggregates, queries, `latest`) and nothing else differs between a located
//! request and a plain one. Work spawned onto other tasks does not see it: the stream path
//! scopes its spawned read itself.
//!
//! [`Request::Located`]: timeshard_proto::wire::Request::Located

use std::future::Future;

use timeshard_proto::geo::GeoPoint;

tokio::task_local! {
    static CLIENT_AT: GeoPoint;
}

/// Runs `f` as the serving of a request whose client is at `at` (`None`: no declared location).
pub async fn scope<F: Future>(at: Option<GeoPoint>, f: F) -> F::Output {
    match at {
        Some(at) => CLIENT_AT.scope(at, f).await,
        None => f.await,
    }
}

/// The location the client of the current request declared, if any.
pub fn declared() -> Option<GeoPoint> {
    CLIENT_AT.try_with(|at| *at).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_declared_location_lives_as_long_as_the_request() {
        let atl = GeoPoint::new(33.75, -84.39).unwrap();
        assert_eq!(declared(), None);
        assert_eq!(scope(Some(atl), async { declared() }).await, Some(atl));
        assert_eq!(scope(None, async { declared() }).await, None);
        assert_eq!(declared(), None);
    }
}
