//! Streamed range reads: a whole range, in order, in batches, without holding it.
//!
//! The range is read in windows of at most [`MAX_BLOCK_PARTS`] quanta (those the quantum index
//! lists, for long ranges). For each window, each owner node gets one
//! [`Request::FetchParts`] carrying every part it answers ([`owner_fetches`]): the first
//! candidate of a part streams its points, the next R-1 its count and digest. A reader task per
//! node decodes its frames into a channel of [`FRAMES_AHEAD`] frames; the merge takes the parts
//! in time order, each from the heads of the channels that hold it, so memory stays within a
//! few frames per node whatever the range (QUIC flow control holds the replicas back).
//!
//! A part's streamed points stand when R settled answers agree on count and digest
//! ([`accepts`]); otherwise (a replica down, catching up or disagreeing) the part is read
//! again the careful way, [`Coordinator::fetch_block`]: R settled replicas, further candidates,
//! exact merge, read repair. Those re-reads run side by side (up to `read_parallelism` parts in
//! line), their results still leaving in time order.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use futures::future::{self, BoxFuture};
use futures::stream::FuturesOrdered;
use futures::{FutureExt, StreamExt};
use timeshard_proto::placement::placement_id;
use timeshard_proto::read;
use timeshard_proto::stream::{FetchPart, PartAnswer, PartChunk, PartEnd, accepts, owner_fetches};
use timeshard_proto::wire::{BlockPart, ErrorCode, ErrorReply, MAX_BLOCK_PARTS, Request, Response};
use timeshard_proto::{Classes, Contact, Id, Point, PointKey, SeriesClass, SeriesKey, TimeRange};
use tokio::sync::mpsc;

use super::Coordinator;
use crate::streams::{FRAMES_AHEAD, PartFrame, PartPages, produce_parts};

/// Most points in one frame of a replica's streamed answer: small enough that a few frames
/// per owner node stay a few megabytes, large enough to amortise the framing.
pub const STREAM_PAGE_POINTS: u32 = 16_384;

/// What a streamed read sends its consumer: batches of points in order, or why it stopped.
pub type BatchSender = mpsc::Sender<Result<Vec<Point>, ErrorReply>>;

/// The consumer went away; nothing more to do.
fn consumer_gone() -> ErrorReply {
    ErrorReply::new(ErrorCode::Unavailable, "the reader went away")
}

/// Collects merged points into batches of `size` for the consumer.
struct Batches<'a> {
    tx: &'a BatchSender,
    buf: Vec<Point>,
    size: usize,
    sent: u64,
}

impl Batches<'_> {
    async fn push(&mut self, points: Vec<Point>) -> Result<(), ErrorReply> {
        self.sent += points.len() as u64;
        if self.buf.is_empty() && points.len() == self.size {
            return self.tx.send(Ok(points)).await.map_err(|_| consumer_gone());
        }
        let mut rest = points.as_slice();
        while !rest.is_empty() {
            let take = (self.size - self.buf.len()).min(rest.len());
            self.buf.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if self.buf.len() >= self.size {
                let full = std::mem::replace(&mut self.buf, Vec::with_capacity(self.size));
                self.tx.send(Ok(full)).await.map_err(|_| consumer_gone())?;
            }
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), ErrorReply> {
        if !self.buf.is_empty() {
            let rest = std::mem::take(&mut self.buf);
            self.tx.send(Ok(rest)).await.map_err(|_| consumer_gone())?;
        }
        Ok(())
    }
}

/// One owner node's streamed answer, as the merge consumes it.
struct Source {
    rx: mpsc::Receiver<PartFrame>,
    /// The window index of each part asked of the node, in the order asked.
    index: Vec<usize>,
    pending: VecDeque<PartChunk>,
    settled: bool,
    ended: bool,
    failed: bool,
}

impl Source {
    /// The node's answer to window part `part`: its points (if it sends them) and its count,
    /// digest and settledness; `None` if the node failed or did not answer the part.
    async fn answer_for(&mut self, part: usize) -> Option<(Vec<Point>, PartAnswer)> {
        let mut points = Vec::new();
        loop {
            if self.failed {
                return None;
            }
            while let Some(chunk) = self.pending.front() {
                let Some(&at) = self.index.get(chunk.part as usize) else {
                    self.failed = true;
                    return None;
                };
                if at > part {
                    return None;
                }
                let chunk = self.pending.pop_front().expect("a front chunk");
                if at < part {
                    continue;
                }
                points.extend(chunk.points);
                if let Some(end) = chunk.end {
                    return Some((points, PartAnswer { end, settled: self.settled }));
                }
            }
            if self.ended {
                return None;
            }
            match self.rx.recv().await {
                Some(Ok(PartPages { chunks, settled, more })) => {
                    self.settled = settled;
                    self.ended = !more;
                    self.pending.extend(chunks);
                }
                Some(Err(_)) | None => self.failed = true,
            }
        }
    }
}

/// Whether `points` are a valid answer for `range`: inside it, strictly ascending, and what
/// the sender's own count and digest say.
fn well_formed(points: &[Point], range: &TimeRange, end: &PartEnd) -> bool {
    points.iter().all(|p| range.contains(p.ts))
        && points.windows(2).all(|w| w[0].key() < w[1].key())
        && PartEnd::of(points) == *end
}

impl Coordinator {
    /// Streams every point of `series` in `range` strictly after `after` to `tx`, in identity
    /// order, in batches of at most `batch` points; an error ends the stream. Nothing is sent
    /// after an error, and the channel closes when the read is done.
    pub async fn read_stream(
        self: Arc<Self>,
        series: SeriesKey,
        range: TimeRange,
        after: Option<PointKey>,
        batch: usize,
        tx: BatchSender,
    ) {
        let mut out = Batches { tx: &tx, buf: Vec::new(), size: batch.max(1), sent: 0 };
        if let Err(e) = self.stream_range(&series, range, after, &mut out).await {
            let _ = tx.send(Err(e)).await;
        }
    }

    async fn stream_range(
        self: &Arc<Self>,
        series: &SeriesKey,
        range: TimeRange,
        after: Option<PointKey>,
        out: &mut Batches<'_>,
    ) -> Result<(), ErrorReply> {
        let classes = self.classes();
        let class = classes.of(series).clone();
        let mut cursor = after;
        while let Some(scan) = read::scan_range(&range, cursor) {
            let (parts, more) = if read::uses_index(scan, class.quantum) {
                let (quanta, more) = self.indexed_quanta(series, &class, scan, MAX_BLOCK_PARTS).await?;
                (read::block_parts(quanta, &scan), more)
            } else {
                read::first_parts(scan, class.quantum, MAX_BLOCK_PARTS)
            };
            self.stream_window(series, &class, &classes, &parts, after, out).await?;
            match (more, parts.last()) {
                (true, Some(last)) => cursor = Some(read::cursor_after(&last.quantum)),
                _ => break,
            }
        }
        out.flush().await?;
        if out.sent == 0 && after.is_none() && !self.series_known(series).await? {
            return Err(ErrorReply::new(
                ErrorCode::UnknownSeries,
                format!("series {series} was never written; check its spelling (metric and tags)"),
            ));
        }
        Ok(())
    }

    /// Opens node `node`'s answer to `parts`: served from the local store when it is this
    /// node, else over one stream; frames arrive on the returned channel.
    fn open_source(
        self: &Arc<Self>,
        node: Contact,
        series: &SeriesKey,
        parts: Vec<FetchPart>,
    ) -> mpsc::Receiver<PartFrame> {
        let (tx, rx) = mpsc::channel(FRAMES_AHEAD);
        let series = series.clone();
        if node.id == self.dht.me().id {
            let store = self.store.clone();
            let settled = self.repair.is_settled();
            tokio::task::spawn_blocking(move || {
                produce_parts(&store, &series, &parts, STREAM_PAGE_POINTS as usize, settled, &tx);
            });
            return rx;
        }
        let net = self.dht.net().clone();
        tokio::spawn(async move {
            let req = Request::FetchParts { series, parts, page_points: STREAM_PAGE_POINTS };
            let mut frames = match net.open_stream(node.addr, node.id, &req).await {
                Ok(f) => f,
                Err(e) => {
                    let _ = tx.send(Err(ErrorReply::new(ErrorCode::Unavailable, e.to_string()))).await;
                    return;
                }
            };
            loop {
                let frame = match frames.next().await {
                    Ok(Some(Response::PartPages { chunks, settled, more })) => Ok(PartPages { chunks, settled, more }),
                    Ok(Some(other)) => Err(ErrorReply::new(
                        ErrorCode::Unavailable,
                        format!("unexpected answer to fetch_parts: {}", other_kind(&other)),
                    )),
                    Ok(None) => Err(ErrorReply::new(ErrorCode::Unavailable, "the replica's answer ended early")),
                    Err(e) => Err(ErrorReply::new(ErrorCode::Unavailable, e.to_string())),
                };
                let last = !matches!(frame, Ok(PartPages { more: true, .. }));
                if tx.send(frame).await.is_err() || last {
                    return;
                }
            }
        });
        rx
    }

    /// Reads one window of parts (in time order) and pushes their points to `out`.
    async fn stream_window(
        self: &Arc<Self>,
        series: &SeriesKey,
        class: &SeriesClass,
        classes: &Classes,
        parts: &[BlockPart],
        after: Option<PointKey>,
        out: &mut Batches<'_>,
    ) -> Result<(), ErrorReply> {
        let targets = parts
            .iter()
            .map(|p| self.target(series, placement_id(series, &p.quantum, classes), class))
            .collect::<Result<Vec<_>, _>>()?;
        // R is the class's, or the context of interest's for this coordinator; the parts of one
        // series share both.
        let r = targets.first().map_or(usize::from(class.replication.r), |t| self.read_r(t, class));
        let candidates: Vec<Vec<Contact>> = targets.iter().map(|t| self.read_candidates(t, class)).collect();
        let mut sources: HashMap<Id, Source> = HashMap::new();
        for (node, asked) in owner_fetches(&candidates, r, self.dht.me().id) {
            let fetch = asked.iter().map(|&(i, points)| FetchPart { part: parts[i], points }).collect();
            let rx = self.open_source(node, series, fetch);
            let index = asked.into_iter().map(|(i, _)| i).collect();
            let source = Source { rx, index, pending: VecDeque::new(), settled: false, ended: false, failed: false };
            sources.insert(node.id, source);
        }
        // Parts leave in time order. A part that does not stand is read again the careful way
        // while the parts after it go on: up to `read_parallelism` parts wait in line, so a
        // window read while replicas are unsettled (after a restart or a membership change)
        // costs a few round trips, not one per quantum.
        let ahead = self.limits().read_parallelism.max(1);
        let mut in_line: FuturesOrdered<BoxFuture<'static, Result<Vec<Point>, ErrorReply>>> = FuturesOrdered::new();
        for (i, part) in parts.iter().enumerate() {
            let mut answers = Vec::with_capacity(r);
            let mut points = Vec::new();
            for (k, c) in candidates[i].iter().take(r).enumerate() {
                let answer = match sources.get_mut(&c.id) {
                    Some(source) => source.answer_for(i).await,
                    None => None,
                };
                if let Some((p, a)) = answer {
                    if k == 0 {
                        points = p;
                    }
                    answers.push(Some(a));
                } else {
                    answers.push(None);
                }
            }
            let stands = accepts(&answers, r) && answers[0].is_some_and(|a| well_formed(&points, &part.range, &a.end));
            if stands {
                if let Some(a) = after
                    && part.range.start() <= a.ts
                {
                    points.retain(|p| p.key() > a);
                }
                in_line.push_back(future::ready(Ok(points)).boxed());
            } else {
                let (me, series, class, target) = (self.clone(), series.clone(), class.clone(), targets[i].clone());
                let (quantum, range) = (part.quantum, part.range);
                in_line.push_back(
                    async move { me.fetch_block(&series, &class, &target, quantum, range, after, usize::MAX).await }
                        .boxed(),
                );
            }
            // A full line waits for its head; parts ready at the head leave at once.
            while in_line.len() >= ahead {
                match in_line.next().await {
                    Some(points) => out.push(points?).await?,
                    None => break,
                }
            }
            while let Some(Some(points)) = in_line.next().now_or_never() {
                out.push(points?).await?;
            }
        }
        while let Some(points) = in_line.next().await {
            out.push(points?).await?;
        }
        Ok(())
    }
}

fn other_kind(resp: &Response) -> String {
    let text = format!("{resp:?}");
    text.chars().take(60).collect()
}
