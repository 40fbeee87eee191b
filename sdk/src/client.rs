//! The client: one QUIC connection to one node.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use quinn::{Connection, Endpoint};
use timeshard_proto::batch;
use timeshard_proto::geo::GeoPoint;
use timeshard_proto::point::ColumnBatch;
use timeshard_proto::point::SeriesPoints;
use timeshard_proto::repair::LeaveProgress;
use timeshard_proto::stream::ReadRun;
use timeshard_proto::tier::ArchiveReport;
use timeshard_proto::window::WindowStats;
use timeshard_proto::wire::{
    Limits, MAX_REPORTED_REJECTIONS, NodeStatus, QueryOutput, RejectedPoint, Request, Response, SeriesFilter,
};
use timeshard_proto::{Point, PointKey, SeriesKey, TimeRange};

use crate::Error;

/// Series a geographic read ([`Client::read_near`]) reads at once.
pub const NEAR_PARALLELISM: usize = 16;
/// Series a geographic read may match.
pub const NEAR_MAX_SERIES: u32 = 10_000;
use crate::tls::{self, Identity, NODE_NAME, TlsFiles};
use crate::transport::{self, CallError};

/// Tunables of a client.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// How long to wait for the handshake.
    pub connect_timeout: Duration,
    /// How long to wait for one request's answer.
    pub request_timeout: Duration,
    /// Points per write request; larger writes are split. Must not exceed the node's
    /// `max_batch_points`.
    pub max_batch_points: usize,
    /// Series per write request; writes of more series are split. Must not exceed the node's
    /// `max_batch_series`.
    pub max_batch_series: usize,
    /// Points per page of a read.
    pub page_points: u32,
    /// Largest message accepted.
    pub max_message_bytes: u32,
}

impl Default for ClientOptions {
    fn default() -> Self {
        let limits = Limits::default();
        ClientOptions {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            max_batch_points: limits.max_batch_points as usize,
            max_batch_series: limits.max_batch_series as usize,
            page_points: limits.max_page_points,
            max_message_bytes: limits.max_message_bytes,
        }
    }
}

/// A node's acknowledgement of a write.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WriteAck {
    /// Points stored (after ingest policies and removing duplicates within the batch).
    pub points: u64,
    /// (series, quantum) blocks the points fell into.
    pub blocks: u64,
    /// Points an ingest policy refused.
    pub rejected: u64,
    /// The first refused points with the policy's reasons.
    pub rejections: Vec<RejectedPoint>,
}

/// A connection to one node. Cheap to clone; clones share the connection, and concurrent
/// requests run on separate streams.
#[derive(Clone, Debug)]
pub struct Client {
    conn: Connection,
    addr: SocketAddr,
    options: Arc<ClientOptions>,
    /// Where this client says it is: sent with its writes and reads ([`Client::with_location`]).
    location: Option<GeoPoint>,
    // Kept so the endpoint lives as long as any clone of the client.
    _endpoint: Endpoint,
}

impl Client {
    /// Connects to the node at `addr` with the certificate files in `tls`.
    pub async fn connect(addr: SocketAddr, tls: &TlsFiles) -> Result<Client, Error> {
        Client::connect_with(addr, &Identity::load(tls)?, ClientOptions::default()).await
    }

    /// Connects with a loaded identity and explicit options.
    pub async fn connect_with(addr: SocketAddr, identity: &Identity, options: ClientOptions) -> Result<Client, Error> {
        let bind: SocketAddr =
            if addr.is_ipv6() { "[::]:0".parse() } else { "0.0.0.0:0".parse() }.expect("a literal address parses");
        let endpoint = Endpoint::client(bind)
            .map_err(|e| Error::Connect { addr, reason: format!("cannot open a UDP socket: {e}") })?;
        Client::connect_on(endpoint, addr, identity, options).await
    }

    /// Connects through an endpoint made elsewhere (one on a simulated socket).
    pub async fn connect_on(
        mut endpoint: Endpoint,
        addr: SocketAddr,
        identity: &Identity,
        options: ClientOptions,
    ) -> Result<Client, Error> {
        endpoint.set_default_client_config(tls::client_config(identity)?);
        let connecting =
            endpoint.connect(addr, NODE_NAME).map_err(|e| Error::Connect { addr, reason: e.to_string() })?;
        let conn = tokio::time::timeout(options.connect_timeout, connecting)
            .await
            .map_err(|_| Error::Connect { addr, reason: format!("no handshake within {:?}", options.connect_timeout) })?
            .map_err(|e| Error::Connect { addr, reason: e.to_string() })?;
        Ok(Client { conn, addr, options: Arc::new(options), location: None, _endpoint: endpoint })
    }

    /// The node's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// This client (sharing its connection) declaring that it is at `lat`, `lon` (degrees):
    /// its writes and reads carry the location, and the coordinating node decides by it, not by
    /// its own location, whether the client is inside a series' context of interest (quorum
    /// reads over the in-CoI replicas: never stale) or outside (the fastest replica: eventual).
    /// Without one, the coordinator's own location decides.
    ///
    /// ```no_run
    /// # async fn f(client: timeshard_sdk::Client) -> Result<(), timeshard_sdk::Error> {
    /// let atlanta = client.with_location(33.75, -84.39)?;
    /// let speed = atlanta.latest(&"traffic.speed{geohash=dn5bpsb}".parse()?).await?;
    /// # Ok(()) }
    /// ```
    pub fn with_location(&self, lat: f64, lon: f64) -> Result<Client, Error> {
        let at = GeoPoint::new(lat, lon)?;
        Ok(Client { location: Some(at), ..self.clone() })
    }

    /// The location this client declares, if any.
    pub fn location(&self) -> Option<GeoPoint> {
        self.location
    }

    async fn call(&self, req: Request) -> Result<Response, Error> {
        let addr = self.addr;
        let req = req.located(self.location);
        transport::call(&self.conn, &req, self.options.max_message_bytes, self.options.request_timeout).await.map_err(
            |e| match e {
                CallError::Remote(reply) => Error::Server { addr, reply },
                source => Error::Transport { addr, source },
            },
        )
    }

    fn transport_error(&self, e: CallError) -> Error {
        match e {
            CallError::Remote(reply) => Error::Server { addr: self.addr, reply },
            source => Error::Transport { addr: self.addr, source },
        }
    }

    fn unexpected(&self, got: &Response) -> Error {
        Error::Protocol { addr: self.addr, what: format!("{got:?}") }
    }

    /// Writes `points` of one series. Returns once every block they fall into was acknowledged
    /// by its write quorum.
    pub async fn write(&self, series: &SeriesKey, points: &[Point]) -> Result<WriteAck, Error> {
        self.write_batch(vec![SeriesPoints { series: series.clone(), points: points.to_vec() }]).await
    }

    /// Writes points of several series; split into requests of at most `max_batch_points`
    /// points and `max_batch_series` series ([`ClientOptions`]), sent one after the other.
    pub async fn write_batch(&self, batch: Vec<SeriesPoints>) -> Result<WriteAck, Error> {
        let mut ack = WriteAck::default();
        for request in write_requests(batch, &self.options) {
            match self.call(request).await? {
                Response::Written { points, blocks, rejected, rejections } => {
                    ack.points += points;
                    ack.blocks += blocks;
                    ack.rejected += rejected;
                    let room = MAX_REPORTED_REJECTIONS.saturating_sub(ack.rejections.len());
                    ack.rejections.extend(rejections.into_iter().take(room));
                }
                other => return Err(self.unexpected(&other)),
            }
        }
        Ok(ack)
    }

    /// All points of `series` in `range`, sorted by time (then event id, then value): the
    /// batches of [`Client::read_stream`], collected.
    pub async fn read(&self, series: &SeriesKey, range: TimeRange) -> Result<Vec<Point>, Error> {
        let mut out = Vec::new();
        let mut batches = std::pin::pin!(self.read_stream(series, range));
        while let Some(batch) = batches.next().await {
            out.extend(batch?.points());
        }
        Ok(out)
    }

    /// Every point of `series` in `range` as a stream of column batches (timestamps, values,
    /// events) in identity order, about `page_points` points each, so a caller can consume a
    /// long range without holding it. The node streams the range over one QUIC stream; each
    /// batch is awaited at most the request timeout. Blocks the range covers whole arrive as
    /// their stores' compressed columns, decoded here off the network task, a few frames side
    /// by side, and checked against the count and digest the replicas agreed on. The stream
    /// ends after the last batch, or with the first error.
    pub fn read_stream(
        &self,
        series: &SeriesKey,
        range: TimeRange,
    ) -> impl Stream<Item = Result<ColumnBatch, Error>> + Send + 'static {
        let req = Request::ReadStream {
            series: series.to_string(),
            start: range.start(),
            end: range.end(),
            after: None,
            batch_points: self.options.page_points,
        };
        let req = req.located(self.location);
        let addr = self.addr;
        let frames = futures::stream::unfold(ReadState::Start(self.clone(), req), |state| async move {
            let (client, mut frames) = match state {
                ReadState::Done => return None,
                ReadState::Start(client, req) => {
                    let opts = &client.options;
                    match transport::open_stream(&client.conn, &req, opts.max_message_bytes, opts.request_timeout, None)
                        .await
                    {
                        Ok(frames) => (client, frames),
                        Err(e) => return Some((Err(client.transport_error(e)), ReadState::Done)),
                    }
                }
                ReadState::Reading(client, frames) => (client, frames),
            };
            loop {
                match frames.next().await {
                    Ok(Some(Response::Batch { runs, more })) => {
                        if runs.is_empty() {
                            if more {
                                continue;
                            }
                            return None;
                        }
                        let next = if more { ReadState::Reading(client, frames) } else { ReadState::Done };
                        return Some((Ok(runs), next));
                    }
                    Ok(Some(other)) => return Some((Err(client.unexpected(&other)), ReadState::Done)),
                    Ok(None) => {
                        let e =
                            Error::Protocol { addr: client.addr, what: "the read ended before its last batch".into() };
                        return Some((Err(e), ReadState::Done));
                    }
                    Err(e) => return Some((Err(client.transport_error(e)), ReadState::Done)),
                }
            }
        });
        frames
            .map(move |runs| async move {
                let runs = runs?;
                let packed = runs_packed(&runs);
                let decode =
                    move || ColumnBatch::from_runs(&runs).map_err(|e| Error::Protocol { addr, what: e.to_string() });
                if packed {
                    tokio::task::spawn_blocking(decode)
                        .await
                        .map_err(|e| Error::Protocol { addr, what: format!("decoding a batch failed: {e}") })?
                } else {
                    decode()
                }
            })
            .buffered(DECODE_AHEAD)
            // Nothing after the first error.
            .scan(false, |failed, batch| {
                let out = (!*failed).then_some(batch);
                *failed = out.as_ref().is_none_or(Result::is_err);
                futures::future::ready(out)
            })
    }

    /// One page of a read: points strictly after `after`, and the cursor to continue from if the
    /// range holds more.
    pub async fn read_page(
        &self,
        series: &SeriesKey,
        range: TimeRange,
        after: Option<PointKey>,
    ) -> Result<(Vec<Point>, Option<PointKey>), Error> {
        let req = Request::Read {
            series: series.to_string(),
            start: range.start(),
            end: range.end(),
            after,
            limit: self.options.page_points,
        };
        match self.call(req).await? {
            Response::Page { points, next } => Ok((points, next)),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Runs query policy `policy` over `range` of `series`: the nodes that own each quantum
    /// reduce their points, and the node this client talks to merges the partial results.
    /// `params` are passed to the policy (e.g. `[("threshold", "49.5")]`).
    pub async fn query(
        &self,
        series: &SeriesKey,
        range: TimeRange,
        policy: &str,
        params: &[(&str, &str)],
    ) -> Result<QueryOutput, Error> {
        let req = Request::Query {
            series: series.to_string(),
            start: range.start(),
            end: range.end(),
            policy: policy.to_string(),
            params: params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        };
        match self.call(req).await? {
            Response::QueryResult(out) => Ok(out),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Min, max, sum, count, first and last of `range` of `series` in windows of `width_ns`
    /// nanoseconds aligned to the Unix epoch (e.g. one minute: `60_000_000_000`), trimmed to
    /// the range. Only windows holding points are returned. Whole quanta inside a window are
    /// answered from block summaries, without reading their points.
    pub async fn aggregate(
        &self,
        series: &SeriesKey,
        range: TimeRange,
        width_ns: i64,
    ) -> Result<Vec<WindowStats>, Error> {
        let req = Request::Aggregate { series: series.to_string(), start: range.start(), end: range.end(), width_ns };
        match self.call(req).await? {
            Response::Windows { windows } => Ok(windows),
            other => Err(self.unexpected(&other)),
        }
    }

    /// The newest point of `series` (the state a situation-awareness application asks for),
    /// or `None` if it holds none.
    pub async fn latest(&self, series: &SeriesKey) -> Result<Option<Point>, Error> {
        let before = timeshard_proto::time::MAX_TIMESTAMP;
        match self.call(Request::Latest { series: series.to_string(), before }).await? {
            Response::Latest { point } => Ok(point),
            other => Err(self.unexpected(&other)),
        }
    }

    /// FogStore's geographic range query (L, R, T): the points in `range` of every series whose
    /// metric starts with `metric_prefix` and whose location (its `geohash=` or `lat=`/`lon=`
    /// tags) lies within `radius_m` metres of `center`, each read from its owners (at most
    /// [`NEAR_PARALLELISM`] reads at once). The radius must be positive and at most half the
    /// earth's circumference; at most [`NEAR_MAX_SERIES`] series may match.
    pub async fn read_near(
        &self,
        metric_prefix: &str,
        center: GeoPoint,
        radius_m: u32,
        range: TimeRange,
    ) -> Result<Vec<(SeriesKey, Vec<Point>)>, Error> {
        if radius_m == 0 || f64::from(radius_m) > timeshard_proto::geo::MAX_DISTANCE_KM * 1_000.0 {
            return Err(timeshard_proto::geo::GeoError::Distance(format!("{radius_m}m")).into());
        }
        let filter = SeriesFilter { metric_prefix: metric_prefix.to_string(), tags: Vec::new() };
        let (all, more) = self.list_series(filter, NEAR_MAX_SERIES).await?;
        if more {
            return Err(Error::TooManySeries(format!(
                "more than {NEAR_MAX_SERIES} series start with {metric_prefix:?}: use a longer metric prefix"
            )));
        }
        let near: Vec<SeriesKey> = all
            .into_iter()
            .filter(|s| {
                timeshard_proto::geo::tagged_location(s)
                    .ok()
                    .flatten()
                    .is_some_and(|at| at.distance_km(&center) * 1_000.0 <= f64::from(radius_m))
            })
            .collect();
        use futures::StreamExt;
        let reads = futures::stream::iter(near.into_iter().map(|s| async move {
            let points = self.read(&s, range).await?;
            Ok::<_, Error>((s, points))
        }))
        .buffered(NEAR_PARALLELISM);
        reads.collect::<Vec<_>>().await.into_iter().collect()
    }

    /// The series of the whole cluster passing `filter`, sorted, at most `limit`; the flag says
    /// whether the limit cut the list.
    pub async fn list_series(&self, filter: SeriesFilter, limit: u32) -> Result<(Vec<SeriesKey>, bool), Error> {
        match self.call(Request::ListSeries { filter, limit }).await? {
            Response::SeriesList { series, more } => Ok((series, more)),
            other => Err(self.unexpected(&other)),
        }
    }

    /// What the node reports about itself.
    pub async fn status(&self) -> Result<NodeStatus, Error> {
        match self.call(Request::Status).await? {
            Response::Status(s) => Ok(*s),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Asks the node to leave the cluster: it hands every block off to the other owners, then
    /// announces that it left and exits. Only the node's own certificate may ask (connect with
    /// the node's certificate and key); asking again reports progress.
    pub async fn leave(&self) -> Result<LeaveProgress, Error> {
        match self.call(Request::Leave).await? {
            Response::Leaving(progress) => Ok(progress),
            other => Err(self.unexpected(&other)),
        }
    }

    /// The cold tier as the node sees it: what the archive holds, this node's pending exports
    /// and its last error (`timeshard archive status`).
    pub async fn archive_status(&self) -> Result<ArchiveReport, Error> {
        match self.call(Request::ArchiveStatus).await? {
            Response::Archive(r) => Ok(*r),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Closes the connection politely.
    pub async fn close(self) {
        self.conn.close(0u32.into(), b"bye");
        self._endpoint.wait_idle().await;
    }
}

/// Where a streamed read is.
/// Frames of a streamed read decoded side by side (each holds about `page_points` points).
const DECODE_AHEAD: usize = 3;

/// Whether `runs` hold packed columns, worth decoding off the network task.
fn runs_packed(runs: &[ReadRun]) -> bool {
    runs.iter().any(|r| matches!(r, ReadRun::Packed(_)))
}

enum ReadState {
    Start(Client, Request),
    Reading(Client, transport::FrameStream),
    Done,
}

/// The write requests of `batch` within `options`' points and series per request.
fn write_requests(batch: Vec<SeriesPoints>, options: &ClientOptions) -> Vec<Request> {
    batch::split(batch, options.max_batch_points, options.max_batch_series)
        .into_iter()
        .map(|chunk| Request::Write { batch: chunk.into_iter().map(Into::into).collect() })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, n: usize) -> SeriesPoints {
        SeriesPoints { series: name.parse().unwrap(), points: vec![Point::new(1_700_000_000_000_000_000, 0.0); n] }
    }

    fn points(requests: &[Request]) -> Vec<usize> {
        requests
            .iter()
            .map(|r| match r {
                Request::Write { batch } => batch.iter().map(|s| s.points.len()).sum(),
                other => panic!("not a write: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn batches_split_at_the_point_limit() {
        let options = ClientOptions { max_batch_points: 5, ..ClientOptions::default() };
        let requests = write_requests(vec![series("m", 7), series("n", 4)], &options);
        assert_eq!(points(&requests), vec![5, 5, 1]);
        assert!(write_requests(vec![], &options).is_empty());
    }

    /// `timeshard put` of a CSV of 10,001 series with one point each went out as one write,
    /// which the node refused: "batch holds 10001 series; the limit is 10000 (BatchTooLarge)".
    #[test]
    fn a_write_of_more_series_than_the_node_takes_is_split() {
        let batch: Vec<SeriesPoints> = (0..10_001).map(|i| series(&format!("m{{id={i}}}"), 1)).collect();
        let requests = write_requests(batch, &ClientOptions::default());
        assert_eq!(points(&requests), vec![10_000, 1]);
        for r in &requests {
            r.validate(&Limits::default()).unwrap();
        }
    }
}
