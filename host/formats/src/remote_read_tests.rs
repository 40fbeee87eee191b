//! Remote read's tests: requests in, both answers out and back, hostile bytes refused.

use proptest::prelude::*;

use super::*;

fn request(queries: Vec<Query>, accepted: &[ResponseType]) -> Vec<u8> {
    let req = ReadRequest { queries, accepted_response_types: accepted.iter().map(|&t| t as i32).collect() };
    compression::snappy(&req.encode_to_vec())
}

fn query(matchers: &[(i32, &str, &str)]) -> Query {
    Query {
        start_timestamp_ms: 1_000,
        end_timestamp_ms: 2_000,
        matchers: matchers
            .iter()
            .map(|&(t, n, v)| LabelMatcher { r#type: t, name: n.into(), value: v.into() })
            .collect(),
        hints: Some(ReadHints { step_ms: 15_000, func: "rate".into(), ..ReadHints::default() }),
    }
}

fn samples(n: usize) -> Vec<Sample> {
    (0..n as i64).map(|i| Sample { t: 1_700_000_000_000 + i * 15_000 + i % 3, v: (i * i) as f64 / 7.0 }).collect()
}

#[test]
fn requests_decode_with_compiled_matchers_and_negotiated_answers() {
    let body = request(
        vec![query(&[(0, "__name__", "up"), (2, "job", "api|web"), (3, "instance", "10\\..*")])],
        &[ResponseType::StreamedXorChunks, ResponseType::Samples],
    );
    let r = decode_request(&body, &ReadLimits::default()).unwrap();
    assert_eq!(r.response, ResponseType::StreamedXorChunks);
    let q = &r.queries[0];
    assert_eq!((q.start_ms, q.end_ms), (1_000, 2_000));
    assert_eq!(q.hints.as_ref().unwrap().func, "rate");
    let l = Labels::from_pairs([("__name__", "up"), ("job", "web"), ("instance", "127.0.0.1")]);
    assert!(crate::promql::matcher::matches_all(&q.matchers, &l));
    let l = Labels::from_pairs([("__name__", "up"), ("job", "web"), ("instance", "10.0.0.1")]);
    assert!(!crate::promql::matcher::matches_all(&q.matchers, &l));
    let r = decode_request(&request(vec![query(&[])], &[]), &ReadLimits::default()).unwrap();
    assert_eq!(r.response, ResponseType::Samples, "no preference: samples");
}

#[test]
fn hostile_requests_are_refused_with_what_was_wrong() {
    let limits = ReadLimits { max_queries: 2, max_matchers: 2, ..ReadLimits::default() };
    let e = decode_request(&request(vec![query(&[]); 3], &[]), &limits).unwrap_err();
    assert_eq!(e, ReadError::TooManyQueries { got: 3, limit: 2 });
    let e = decode_request(&request(vec![query(&[(0, "a", "b"); 3])], &[]), &limits).unwrap_err();
    assert_eq!(e, ReadError::TooManyMatchers { query: 0, got: 3, limit: 2 });
    let e = decode_request(&request(vec![query(&[(7, "a", "b")])], &[]), &limits).unwrap_err();
    assert_eq!(e, ReadError::MatcherType { query: 0, kind: 7 });
    let e = decode_request(&request(vec![query(&[(2, "a", "(a{1000}){1000}")])], &[]), &limits).unwrap_err();
    assert!(e.to_string().contains("limit"), "{e}");
    let mut q = query(&[]);
    q.end_timestamp_ms = 0;
    assert!(matches!(decode_request(&request(vec![q], &[]), &limits), Err(ReadError::Range { .. })));
    let e = decode_request(&compression::snappy(b"\xff\xff\xff"), &limits).unwrap_err();
    assert!(e.to_string().contains("prometheus.ReadRequest"), "{e}");
    let big = request(vec![query(&[(0, "a", &"x".repeat(2_000_000))])], &[]);
    assert!(matches!(decode_request(&big, &limits), Err(ReadError::Decompress(_))));
}

#[test]
fn sampled_answers_round_trip() {
    let l = Labels::from_pairs([("__name__", "up"), ("job", "a")]);
    let s = samples(5);
    let body = sampled_response([vec![(&l, s.as_slice())], vec![]]);
    let resp = ReadResponse::decode(compression::unsnappy(&body, 1 << 20).unwrap().as_slice()).unwrap();
    assert_eq!(resp.results.len(), 2);
    let ts = &resp.results[0].timeseries[0];
    assert_eq!(ts.labels.len(), 2);
    assert_eq!(ts.samples.iter().map(|x| Sample { t: x.timestamp, v: x.value }).collect::<Vec<_>>(), s);
}

#[test]
fn streamed_answers_frame_chunk_and_read_back() {
    let series: Vec<(Labels, Vec<Sample>)> =
        (0..20).map(|i| (Labels::from_pairs([("__name__", "m"), ("i", &i.to_string())]), samples(250 + i))).collect();
    let mut enc = StreamEncoder::new(3, 4096);
    let mut stream = Vec::new();
    for (l, s) in &series {
        stream.extend(enc.push(l, s).into_iter().flatten());
    }
    stream.extend(enc.finish().into_iter().flatten());
    let mut reader = FrameReader::new(&stream, DEFAULT_FRAME_BYTES);
    let mut got = Vec::new();
    let mut frames = 0;
    while let Some(msg) = reader.next_message() {
        let msg = msg.unwrap();
        frames += 1;
        assert_eq!(msg.query_index, 3);
        for cs in &msg.chunked_series {
            assert!(!cs.chunks.is_empty());
            assert!(cs.chunks.iter().all(|c| c.r#type == CHUNK_XOR));
            got.push(series_samples(cs, SAMPLES_PER_CHUNK).unwrap());
        }
    }
    assert!(frames > 5, "a 4 KiB frame holds a few series: {frames} frames");
    assert_eq!(got, series.iter().map(|s| s.1.clone()).collect::<Vec<_>>());
    assert_eq!(chunks_of(&samples(250)).len(), 3, "120 samples per chunk");
}

#[test]
fn corrupt_streams_are_errors() {
    let l = Labels::from_pairs([("__name__", "m")]);
    let mut enc = StreamEncoder::new(0, DEFAULT_FRAME_BYTES);
    assert!(enc.push(&l, &samples(10)).is_none());
    let good = enc.finish().unwrap();
    let mut bad = good.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert_eq!(FrameReader::new(&bad, 1 << 20).next_message(), Some(Err(FrameError::Checksum { index: 0 })));
    assert_eq!(
        FrameReader::new(&good[..good.len() - 1], 1 << 20).next_message(),
        Some(Err(FrameError::Truncated { index: 0 }))
    );
    assert!(matches!(FrameReader::new(&good, 8).next_message(), Some(Err(FrameError::TooLarge { .. }))));
    // A bad length prefix must end the stream (it looped on the same error once).
    let mut r = FrameReader::new(&[0xff; 11], 1 << 20);
    assert!(r.next_message().unwrap().is_err());
    assert!(r.next_message().is_none(), "a bad frame ends the stream");
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_request(&data, &ReadLimits::default());
        let mut r = FrameReader::new(&data, 1 << 16);
        while let Some(m) = r.next_message() {
            if let Ok(m) = m {
                for s in &m.chunked_series {
                    let _ = series_samples(s, 120);
                }
            }
        }
    }
}
