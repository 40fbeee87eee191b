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
use timeshard_proto::packed::{PackedColumns, PackedPart};
use timeshard_proto::placement::placement_id;
use timeshard_proto::read;
use timeshard_proto::stream::{
    ColumnBatch, FetchPart, PartAnswer, PartChunk, PartEnd, ReadRun, accepts, owner_fetches,
};
use timeshard_proto::wire::{BlockPart, ErrorCode, ErrorReply, MAX_BLOCK_PARTS, Request, Response};
use timeshard_proto::{Classes, Contact, Id, Point, PointKey, SeriesClass, SeriesKey, TimeRange};
use tokio::sync::mpsc;

use super::Coordinator;
use crate::replica::{FRAMES_AHEAD, PartFrame, PartPages};

/// Most points in one frame of a replica's streamed answer: small enough that a few frames
/// per owner node stay a few megabytes, large enough to amortise the framing.
pub const STREAM_PAGE_POINTS: u32 = 16_384;

/// What a streamed read sends its consumer: runs in order (points, or parts packed as their
/// blocks' sealed columns, counted as the points they claim), or why it stopped.
pub type BatchSender = mpsc::Sender<Result<Vec<ReadRun>, ErrorReply>>;

/// The consumer went away; nothing more to do.
fn consumer_gone() -> ErrorReply {
    ErrorReply::new(ErrorCode::Unavailable, "the reader went away")
}

/// Collects merged runs into batches of about `size` points for the consumer.
struct Batches<'a> {
    tx: &'a BatchSender,
    buf: Vec<ReadRun>,
    /// Points in `buf`.
    held: usize,
    size: usize,
    sent: u64,
}

impl Batches<'_> {
    /// Adds points, in batches of at most `size` points.
    async fn push(&mut self, points: Vec<Point>) -> Result<(), ErrorReply> {
        let mut rest = points.as_slice();
        while !rest.is_empty() {
            let take = (self.size - self.held).min(rest.len());
            match self.buf.last_mut() {
                Some(ReadRun::Points(p)) => p.extend_from_slice(&rest[..take]),
                _ => self.buf.push(ReadRun::Points(rest[..take].to_vec())),
            }
            self.held += take;
            self.sent += take as u64;
            rest = &rest[take..];
            if self.held >= self.size {
                self.send().await?;
            }
        }
        Ok(())
    }

    /// Adds a packed part whole; a batch holding it may pass `size` by less than one block.
    async fn push_packed(&mut self, part: PackedPart) -> Result<(), ErrorReply> {
        let n = part.count() as usize;
        if self.held > 0 && self.held + n > self.size {
            self.send().await?;
        }
        self.held += n;
        self.sent += n as u64;
        self.buf.push(ReadRun::Packed(part));
        if self.held >= self.size {
            self.send().await?;
        }
        Ok(())
    }

    async fn send(&mut self) -> Result<(), ErrorReply> {
        let runs = std::mem::take(&mut self.buf);
        self.held = 0;
        self.tx.send(Ok(runs)).await.map_err(|_| consumer_gone())
    }

    async fn flush(&mut self) -> Result<(), ErrorReply> {
        if !self.buf.is_empty() {
            self.send().await?;
        }
        Ok(())
    }
}

/// A streamed read on this node, decoded: column batches in identity order
/// ([`Coordinator::read_columns`]). Dropping it stops the read.
#[derive(Debug)]
pub struct ColumnReader {
    rx: mpsc::Receiver<Result<Vec<ReadRun>, ErrorReply>>,
}

impl ColumnReader {
    /// The next batch (possibly empty), the error that ended the read, or `None` at its end.
    pub async fn next(&mut self) -> Option<Result<ColumnBatch, ErrorReply>> {
        let runs = match self.rx.recv().await? {
            Ok(runs) => runs,
            Err(e) => return Some(Err(e)),
        };
        Some(
            ColumnBatch::from_runs(&runs)
                .map_err(|e| ErrorReply::new(ErrorCode::Internal, format!("a part of the read did not decode: {e}"))),
        )
    }
}

/// What the point sender of a part sent for it.
enum Content {
    Points(Vec<Point>),
    Packed(PackedColumns),
}

/// A part ready to leave, in time order.
enum Ready {
    Points(Vec<Point>),
    Packed(PackedPart),
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
    async fn answer_for(&mut self, part: usize) -> Option<(Content, PartAnswer)> {
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
                let answer = |end| PartAnswer { end, settled: self.settled };
                match (chunk.packed, chunk.end) {
                    // A packed part comes whole, in one chunk.
                    (Some(packed), Some(end)) if points.is_empty() && chunk.points.is_empty() => {
                        return Some((Content::Packed(packed), answer(end)));
                    }
                    (Some(_), _) => {
                        self.failed = true;
                        return None;
                    }
                    (None, end) => {
                        points.extend(chunk.points);
                        if let Some(end) = end {
                            return Some((Content::Points(points), answer(end)));
                        }
                    }
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
        let mut out = Batches { tx: &tx, buf: Vec::new(), held: 0, size: batch.max(1), sent: 0 };
        if let Err(e) = self.stream_range(&series, range, after, &mut out).await {
            let _ = tx.send(Err(e)).await;
        }
    }

    /// [`Coordinator::read_stream`] in a task of its own, decoded for a reader on this node
    /// (the HTTP side): batches of at most about `batch` points.
    pub fn read_columns(
        self: &Arc<Self>,
        series: SeriesKey,
        range: TimeRange,
        after: Option<PointKey>,
        batch: usize,
    ) -> ColumnReader {
        let (tx, rx) = mpsc::channel(FRAMES_AHEAD);
        tokio::spawn(self.clone().read_stream(series, range, after, batch, tx));
        ColumnReader { rx }
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
        in_coi: Option<SeriesKey>,
    ) -> mpsc::Receiver<PartFrame> {
        let series = series.clone();
        if node.id == self.dht.me().id {
            let (rx, _producer) = self.replica.fetch_parts(series, parts, STREAM_PAGE_POINTS as usize);
            return rx;
        }
        let (tx, rx) = mpsc::channel(FRAMES_AHEAD);
        let net = self.dht.net().clone();
        tokio::spawn(async move {
            let req = Request::FetchParts { series, parts, page_points: STREAM_PAGE_POINTS, in_coi };
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
        let (r, in_coi) =
            targets.first().map_or((usize::from(class.replication.r), false), |t| self.read_quorum(t, class));
        let candidates: Vec<Vec<Contact>> = targets.iter().map(|t| self.read_candidates(t, class)).collect();
        let mut sources: HashMap<Id, Source> = HashMap::new();
        for (node, asked) in owner_fetches(&candidates, r, self.dht.me().id) {
            let fetch = asked.iter().map(|&(i, points)| FetchPart { part: parts[i], points }).collect();
            let rx = self.open_source(node, series, fetch, in_coi.then(|| series.clone()));
            let index = asked.into_iter().map(|(i, _)| i).collect();
            let source = Source { rx, index, pending: VecDeque::new(), settled: false, ended: false, failed: false };
            sources.insert(node.id, source);
        }
        // Parts leave in time order. A part that does not stand is read again the careful way
        // while the parts after it go on: up to `read_parallelism` parts wait in line, so a
        // window read while replicas are unsettled (after a restart or a membership change)
        // costs a few round trips, not one per quantum.
        let ahead = self.limits().read_parallelism.max(1);
        let mut in_line: FuturesOrdered<BoxFuture<'static, Result<Ready, ErrorReply>>> = FuturesOrdered::new();
        for (i, part) in parts.iter().enumerate() {
            let mut answers = Vec::with_capacity(r);
            let mut content = None;
            for (k, c) in candidates[i].iter().take(r).enumerate() {
                let answer = match sources.get_mut(&c.id) {
                    Some(source) => source.answer_for(i).await,
                    None => None,
                };
                if let Some((got, a)) = answer {
                    if k == 0 {
                        content = Some(got);
                    }
                    answers.push(Some(a));
                } else {
                    answers.push(None);
                }
            }
            let ready = match (accepts(&answers, r), content, answers[0]) {
                (true, Some(content), Some(first)) => standing(content, part, first.end, after),
                _ => None,
            };
            match ready {
                Some(ready) => in_line.push_back(future::ready(Ok(ready)).boxed()),
                None => {
                    let (me, series, class, target) = (self.clone(), series.clone(), class.clone(), targets[i].clone());
                    let (quantum, range) = (part.quantum, part.range);
                    in_line.push_back(
                        async move {
                            me.fetch_block(&series, &series, &class, &target, quantum, range, after, usize::MAX)
                                .await
                                .map(Ready::Points)
                        }
                        .boxed(),
                    );
                }
            }
            // A full line waits for its head; parts ready at the head leave at once.
            while in_line.len() >= ahead {
                match in_line.next().await {
                    Some(ready) => out.take(ready?).await?,
                    None => break,
                }
            }
            while let Some(Some(ready)) = in_line.next().now_or_never() {
                out.take(ready?).await?;
            }
        }
        while let Some(ready) = in_line.next().await {
            out.take(ready?).await?;
        }
        Ok(())
    }
}

impl Batches<'_> {
    async fn take(&mut self, ready: Ready) -> Result<(), ErrorReply> {
        match ready {
            Ready::Points(points) => self.push(points).await,
            Ready::Packed(part) => self.push_packed(part).await,
        }
    }
}

/// What a part whose answers agree ([`accepts`]) sends on: its packed columns as they came
/// (the client checks them against `end`), or its points, checked here and trimmed to the
/// read's cursor. `None` when the sender's points are not what it claimed (read the part again).
fn standing(content: Content, part: &BlockPart, end: PartEnd, after: Option<PointKey>) -> Option<Ready> {
    let cut = after.is_some_and(|a| part.range.start() <= a.ts);
    match content {
        Content::Packed(columns) if !cut => Some(Ready::Packed(PackedPart { range: part.range, end, columns })),
        // Only the first part of a resumed read: decode it (checked) to trim it.
        Content::Packed(columns) => {
            let points = PackedPart { range: part.range, end, columns }.points().ok()?;
            Some(Ready::Points(trimmed(points, after)))
        }
        Content::Points(points) => {
            well_formed(&points, &part.range, &end).then(|| Ready::Points(trimmed(points, after.filter(|_| cut))))
        }
    }
}

/// `points` strictly after `after`.
fn trimmed(mut points: Vec<Point>, after: Option<PointKey>) -> Vec<Point> {
    if let Some(a) = after {
        points.retain(|p| p.key() > a);
    }
    points
}

fn other_kind(resp: &Response) -> String {
    let text = format!("{resp:?}");
    text.chars().take(60).collect()
}

#[cfg(test)]
mod tests {
    use timeshard_proto::QuantumLen;

    use super::*;

    const SEC: i64 = 1_000_000_000;

    fn part() -> (BlockPart, Vec<Point>) {
        let quantum = QuantumLen::DEFAULT.quantum_of(100 * SEC);
        let points = (0..100).map(|i| Point::new(quantum.start + i * (SEC / 20), i as f64)).collect();
        (BlockPart { quantum, range: quantum.range() }, points)
    }

    fn points_of(ready: Option<Ready>) -> Vec<Point> {
        match ready {
            Some(Ready::Points(p)) => p,
            Some(Ready::Packed(p)) => panic!("packed: {p:?}"),
            None => panic!("refused"),
        }
    }

    #[test]
    fn agreed_packed_parts_go_on_undecoded_unless_the_cursor_cuts_them() {
        let (part, points) = part();
        let end = PartEnd::of(&points);
        let packed = || Content::Packed(PackedColumns::of(&points));
        match standing(packed(), &part, end, None) {
            Some(Ready::Packed(p)) => {
                assert_eq!((p.range, p.end), (part.range, end));
                assert_eq!(p.points().unwrap(), points);
            }
            _ => panic!("an uncut packed part goes on packed"),
        }
        // A cursor before the part does not cut it.
        let before = Point::new(part.range.start() - 1, 0.0).key();
        assert!(matches!(standing(packed(), &part, end, Some(before)), Some(Ready::Packed(_))));
        // A cursor inside it: decoded, checked and trimmed.
        let cursor = points[39].key();
        assert_eq!(points_of(standing(packed(), &part, end, Some(cursor))), points[40..]);
        // Packed columns that are not what the replicas agreed on are read again.
        let wrong = PartEnd { digest: end.digest ^ 1, ..end };
        assert!(standing(packed(), &part, wrong, Some(cursor)).is_none());
    }

    #[test]
    fn points_stand_only_when_well_formed() {
        let (part, points) = part();
        let end = PartEnd::of(&points);
        assert_eq!(points_of(standing(Content::Points(points.clone()), &part, end, None)), points);
        assert_eq!(
            points_of(standing(Content::Points(points.clone()), &part, end, Some(points[9].key()))),
            points[10..]
        );
        let mut reversed = points.clone();
        reversed.reverse();
        assert!(standing(Content::Points(reversed), &part, end, None).is_none());
        assert!(standing(Content::Points(points[1..].to_vec()), &part, end, None).is_none());
    }
}
