//! Seed inputs for each target, made with the project's own encoders so they stay valid as the
//! formats change: `write-seeds` writes them into `fuzz/corpus/`, and the replay test runs them.

use timeshard_formats::compression;
use timeshard_formats::remote_write::{self, Label, Sample, TimeSeries, WriteRequest};
use timeshard_proto::wire::{self, Request, Response, WriteSeries};
use timeshard_proto::{Point, QuantumLen, SeriesKey};

/// `(target, seed name, bytes)` for every target.
pub fn seeds() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let key = "pmu.phase{bus=7,site=atl}".parse::<SeriesKey>().expect("a valid key");
    let points: Vec<Point> =
        (0..50).map(|i| Point::new(1_700_000_000_000_000_000 + i * 16_666_666, 50.0 + i as f64)).collect();
    let quantum = QuantumLen::new(10_000_000_000).expect("10 s").quantum_of(points[0].ts);
    let mut out = Vec::new();

    let write =
        Request::Write { batch: vec![WriteSeries { series: key.as_str().to_string(), points: points[..3].to_vec() }] };
    let read = Request::Read { series: key.as_str().to_string(), start: 0, end: i64::MAX / 2, after: None, limit: 100 };
    for (name, request) in [("write", &write), ("read", &read), ("status", &Request::Status)] {
        out.push(("wire_request", name, frame_body(request)));
    }
    // A located read, and the bytes of that envelope stacked 1,000 deep (decoding refuses the
    // second level before reading it).
    let at = timeshard_proto::geo::GeoPoint::new(33.75, -84.39).expect("a valid location");
    let located = frame_body(&read.clone().located(Some(at)));
    let envelope = &located[..located.len() - frame_body(&read).len()];
    out.push(("wire_request", "located", located.clone()));
    out.push(("wire_request", "located-nested", [envelope.repeat(1_000), frame_body(&read)].concat()));
    out.push((
        "wire_response",
        "pong",
        frame_body(&Response::Pong { id: timeshard_proto::Id::of_public_key(b"seed") }),
    ));

    let lines = b"pmu.phase,bus=7,site=atl value=49.98 1700000000000000000\n\
        cpu,host=edge\\ 7 usage_idle=97.5,procs=212i 1700000000\n# comment\n";
    out.push(("line_protocol", "two-lines", [&[0u8][..], lines].concat()));
    let rows = "series,ts,value,event\n\"pmu.phase{bus=7,site=atl}\",1700000000000000000,49.98,\n\
        cpu,2023-11-14T22:13:20Z,97.5,2\n\nm,now-15m,1e3\n";
    out.push(("csv_points", "series-in-rows", [&[0u8][..], rows.as_bytes()].concat()));
    out.push(("csv_points", "series-given", [&[1u8][..], b"ts,value\n1,2.5\nnow,-3,7\n"].concat()));
    for (name, q) in [
        (
            "grafana",
            "SELECT mean(value) FROM \"pmu.phase\" WHERE site = 'atl' AND time >= now() - 1h GROUP BY time(1m), bus fill(none)",
        ),
        ("nested", "SELECT value FROM m WHERE ((a = 'b') AND (time > 0))"),
        ("show", "SHOW TAG VALUES FROM \"pmu.phase\" WITH KEY = bus; SHOW MEASUREMENTS"),
    ] {
        out.push(("influxql", name, q.as_bytes().to_vec()));
    }
    for (name, q) in [
        ("rate", "sum by (job) (rate(http_requests_total{job=~\"a.*\"}[5m]))"),
        ("quantile", "histogram_quantile(0.9, sum by (le) (rate(latency_bucket[1m])))"),
        ("binary", "temp > on(site) group_left 20 * 2 ^ 3 or vector(1) unless absent(temp)"),
        ("subquery", "max_over_time(deriv(temp[2m])[5m:30s] offset 1m) @ 300"),
        (
            "functions",
            "label_replace(topk(2, temp), \"x\", \"$1\", \"site\", \"(.*)\") - ignoring(x) clamp(temp, 0, 1)",
        ),
    ] {
        out.push(("promql", name, q.as_bytes().to_vec()));
    }
    for (which, name, q) in [
        (0u8, "query", "query=sum(rate(http_requests_total[5m]))&time=300&timeout=10s"),
        (1, "query_range", "query=temp&start=0&end=600&step=15s"),
        (2, "series", "match[]=temp&match[]={__name__=~\"lat.*\"}&start=0&end=2023-11-14T22:13:20Z"),
        (3, "labels", "match[]=up&start=1700000000.5"),
        (4, "label_values", "job&start=0&end=600"),
        (5, "v1_times", "start=now-15m&end=now%2B1h&t=2023-11-14T22:13:20.5Z&d=1h30m"),
    ] {
        out.push(("prometheus_api", name, [&[which][..], q.as_bytes()].concat()));
    }
    {
        use prost::Message;
        use timeshard_formats::remote_read::{LabelMatcher, Query, ReadRequest};
        let request = ReadRequest {
            queries: vec![Query {
                start_timestamp_ms: 0,
                end_timestamp_ms: 600_000,
                matchers: vec![
                    LabelMatcher { r#type: 0, name: "__name__".into(), value: "temp".into() },
                    LabelMatcher { r#type: 2, name: "site".into(), value: "a.*".into() },
                ],
                hints: None,
            }],
            accepted_response_types: vec![1, 0],
        };
        out.push(("remote_read", "request", [&[0u8][..], &compression::snappy(&request.encode_to_vec())].concat()));
        let labels = timeshard_formats::promql::Labels::from_pairs([("__name__", "temp"), ("site", "atl")]);
        let samples: Vec<_> =
            (0..300).map(|i| timeshard_formats::promql::Sample { t: i * 15_000, v: 20.0 + (i % 7) as f64 }).collect();
        let mut stream = timeshard_formats::remote_read::StreamEncoder::new(0, 1 << 20);
        let mut frames: Vec<u8> = stream.push(&labels, &samples).unwrap_or_default();
        frames.extend(stream.finish().unwrap_or_default());
        out.push(("remote_read", "streamed-answer", [&[1u8][..], &frames].concat()));
    }
    let request = WriteRequest {
        timeseries: vec![TimeSeries {
            labels: vec![
                Label { name: "__name__".into(), value: "up".into() },
                Label { name: "job".into(), value: "n".into() },
            ],
            samples: vec![Sample { value: 1.0, timestamp: 1_700_000_000_000 }],
        }],
    };
    out.push(("remote_write", "one-sample", remote_write::encode(&request)));
    out.push(("gzip", "lines", compression::gzip(lines)));
    out.push(("snappy", "lines", compression::snappy(lines)));

    for (name, codec) in [("pco", timeshard_store::block::Codec::Pco), ("xor", timeshard_store::block::Codec::Xor)] {
        let mut block = Vec::new();
        timeshard_store::block::encode(&mut block, 1, quantum, &points, codec);
        out.push(("store_block", name, block));
    }
    let mut wal = Vec::new();
    timeshard_store::wal::put_series(&mut wal, 1, true, &key);
    timeshard_store::wal::put_points(&mut wal, 1, quantum, &points);
    // A record for the record decoder is its kind and body: cut the frame header (12 bytes) off.
    let series_len = 12 + u32::from_le_bytes(wal[4..8].try_into().expect("4 bytes")) as usize;
    out.push(("store_wal_record", "series", wal[12..series_len].to_vec()));
    out.push(("store_wal_record", "points", wal[series_len + 12..].to_vec()));
    let mut segment = Vec::new();
    timeshard_store::wal::put_header(&mut segment, 1);
    segment.extend_from_slice(&wal);
    out.push(("store_open", "one-segment", [&[0u8][..], &segment].concat()));

    let (points_file, manifest) = archive_files(&crate::archive_file_id(), None, &key, quantum, &points);
    out.push(("tier_points", "one-block", points_file));
    out.push(("tier_manifest", "one-block", manifest));

    out.push(("csr", "device", device_csr().into_bytes()));
    out.push(("control_json", "report", br#"{"generation":3,"digest":"ab","health":"ok"}"#.to_vec()));
    out.push(("policy_signature", "key", b"timeshard-policy-public-key-v1 00".to_vec()));
    out.push(("policy_floors", "one-floor", br#"{"pmu-validate": "1.3.0"}"#.to_vec()));
    // The smallest component: the preamble of the component-model binary format.
    out.push(("policy_module", "empty-component", b"\0\0asm\x0d\0\x01\0".to_vec()));
    #[cfg(feature = "node")]
    {
        let defaults = timeshard_node::config::NodeConfig::default();
        out.push(("node_config", "defaults", toml::to_string(&defaults).expect("defaults print").into_bytes()));
        out.push(("node_config", "deploy-example", include_bytes!("../../deploy/node.toml").to_vec()));
        let fleet = crate::fleet::fleet();
        let now = u64::try_from(crate::NOW_NS).expect("a positive time");
        let encode = |e: &timeshard_proto::membership::GossipEntry| postcard::to_stdvec(e).expect("an entry encodes");
        out.push(("gossip_entry", "signed", encode(&crate::fleet::signed_entry(&fleet.node, now))));
        out.push(("gossip_entry", "client", encode(&crate::fleet::signed_entry(&fleet.client, now))));
        out.push(("gossip_entry", "other-ca", encode(&crate::fleet::signed_entry(&fleet.stranger, now))));
        // A manifest sealed by the fleet node whose folder the target puts it in.
        let id = crate::fleet::sealed_file_id();
        let (_, sealed) = archive_files(&id, Some(&fleet.sealer), &key, quantum, &points);
        out.push(("tier_manifest", "sealed", sealed));
        let mut tampered = crate::fleet::signed_entry(&fleet.node, now);
        tampered.member.status = timeshard_proto::membership::MemberStatus::Left;
        out.push(("gossip_entry", "tampered", encode(&tampered)));
    }
    out
}

/// A frame's body (the header cut off), as the server decodes it.
fn frame_body<T: serde::Serialize>(msg: &T) -> Vec<u8> {
    wire::encode(msg, u32::MAX).expect("it encodes")[wire::HEADER_BYTES..].to_vec()
}

/// A certificate signing request as `timeshard node --enroll` makes one.
fn device_csr() -> String {
    let key = rcgen::KeyPair::generate().expect("a key");
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name.push(rcgen::DnType::CommonName, "timeshard node");
    params.serialize_request(&key).expect("a CSR").pem().expect("PEM")
}

/// A points file and its manifest (sealed with `keys`, if given) as an export writes them as
/// `id`, for one block.
fn archive_files(
    id: &timeshard_tier::FileId,
    keys: Option<&timeshard_tier::seal::Keys>,
    key: &SeriesKey,
    quantum: timeshard_proto::Quantum,
    points: &[Point],
) -> (Vec<u8>, Vec<u8>) {
    use timeshard_tier::layout::Kind;
    use timeshard_tier::manifest::{Entry, FORMAT_VERSION, Header};
    let mut writer = timeshard_tier::write::PointsWriter::new(1 << 20);
    let series = writer.begin_series(key);
    writer.push(series, points).expect("the writer takes sorted points");
    writer.finish().expect("the footer");
    let mut file = writer.take_output().to_vec();
    let rest = writer.take_output();
    file.extend_from_slice(&rest);
    let summary = timeshard_store::Summary::of(points).expect("non-empty");
    let header = Header {
        format: FORMAT_VERSION,
        class: id.class.clone(),
        day: id.day.to_string(),
        node: id.node.clone(),
        seq: id.seq,
        points_file: id.path(Kind::Points).to_string(),
        points_bytes: file.len() as u64,
        points_rows: points.len() as u64,
        blocks: 1,
        created_ns: crate::NOW_NS,
        value_encoding: "dictionary".into(),
        written_ns: None,
        row_groups: Vec::new(),
    };
    let entry = Entry { series: key.clone(), quantum, row_start: 0, summary, covers: summary.digest, base: 0 };
    let manifest = timeshard_tier::write::encode_manifest(&header, &[entry], keys).expect("a manifest");
    (file, manifest.to_vec())
}
