//! The HTTP side of a cluster of node processes: InfluxDB line protocol and Prometheus remote
//! write in through one node, the JSON API and the InfluxQL subset out through another, and
//! every kind of bad input refused with a status and a message while the rest of the batch is
//! stored; HTTPS with the fleet's certificates; requests beyond the limits refused in time.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use timeshard_formats::compression::gzip;
use timeshard_formats::remote_write::{self, Label, Sample, TimeSeries, WriteRequest};
use timeshard_node::config::ClassConfig;
use timeshard_sdk::tls::{Identity, TlsFiles};
use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};
use timeshard_testkit::http_client::{HttpClient, encode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::NODE;

const TOKEN: &str = "e2e-token-0123456789abcdef";
const T: i64 = 1_699_999_980; // a whole minute, in seconds
const SEC: i64 = 1_000_000_000;

async fn cluster(nodes: usize, body_limit: usize) -> anyhow::Result<(LocalCluster, tempfile::TempDir)> {
    let (mut options, dir) = ClusterOptions::for_tests(nodes, NODE);
    let (rf, w) = if nodes >= 3 { (3, 2) } else { (1, 1) };
    options.classes = vec![ClassConfig { name: "all".into(), rf, w, r: w, ..Default::default() }];
    options.http.tokens = vec![TOKEN.into()];
    options.http.max_body_bytes = body_limit;
    Ok((LocalCluster::start_converged(options).await?, dir))
}

/// One node, RF 1, with `[http]` changed by `http`.
async fn one_node(
    http: impl FnOnce(&mut timeshard_node::http::HttpConfig),
) -> anyhow::Result<(LocalCluster, tempfile::TempDir)> {
    let (mut options, dir) = ClusterOptions::for_tests(1, NODE);
    options.classes = vec![ClassConfig { name: "all".into(), rf: 1, w: 1, r: 1, ..Default::default() }];
    options.http.tokens = vec![TOKEN.into()];
    http(&mut options.http);
    Ok((LocalCluster::start_converged(options).await?, dir))
}

fn error(v: Value) -> String {
    v["error"].as_str().unwrap_or_default().to_string()
}

async fn client(cluster: &LocalCluster, i: usize) -> anyhow::Result<HttpClient> {
    HttpClient::connect(cluster.http_addr(i).expect("HTTP is on"), Some(TOKEN)).await
}

/// Values of a raw read through the JSON API.
async fn read_values(c: &mut HttpClient, series: &str, start: i64, end: i64) -> anyhow::Result<Vec<(i64, f64)>> {
    let a = c.get(&format!("/v1/read?series={}&start={start}&end={end}", encode(series))).await?;
    assert_eq!(a.status, 200, "{}", a.text());
    Ok(a.read_points()?.iter().map(|p| (p["ts"].as_i64().unwrap(), p["value"].as_f64().unwrap())).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn line_protocol_and_remote_write_in_json_and_influxql_out() -> anyhow::Result<()> {
    let (cluster, _dir) = cluster(3, 1 << 20).await?;
    let mut writer = client(&cluster, 0).await?;
    let mut reader = client(&cluster, 2).await?;

    // v1 line protocol, seconds: two series of measurement `pmu.phase` (field value), a
    // second field, an integer, a boolean.
    let mut body = String::new();
    for i in 0..180 {
        body.push_str(&format!("pmu.phase,site=atl,bus=1 value={}.5,ok=t,count={i}i {}\n", i % 60, T + i));
        body.push_str(&format!("pmu.phase,site=bos,bus=2 value={} {}\n", 100 + i, T + i));
    }
    let a = writer.post("/write?db=edge&precision=s", body.clone()).await?;
    assert_eq!(a.status, 204, "{}", a.text());
    let got = read_values(&mut reader, "pmu.phase{bus=1,site=atl}", T * SEC, (T + 3) * SEC).await?;
    assert_eq!(got, vec![(T * SEC, 0.5), ((T + 1) * SEC, 1.5), ((T + 2) * SEC, 2.5)]);
    let got = read_values(&mut reader, "pmu.phase.count{bus=1,site=atl}", (T + 179) * SEC, (T + 180) * SEC).await?;
    assert_eq!(got, vec![((T + 179) * SEC, 179.0)]);

    // v2, gzip, milliseconds.
    let v2 =
        format!("cpu,host=edge\\ 7 usage_idle=97.5 {}\ncpu,host=edge\\ 7 usage_idle=96 {}\n", T * 1000, T * 1000 + 500);
    let a = writer
        .send(
            hyper::Method::POST,
            "/api/v2/write?org=o&bucket=b&precision=ms",
            &[("content-encoding", "gzip")],
            gzip(v2.as_bytes()),
        )
        .await?;
    assert_eq!(a.status, 204, "{}", a.text());
    let got = read_values(&mut reader, "cpu.usage_idle{host=edge%207}", T * SEC, (T + 1) * SEC).await?;
    assert_eq!(got, vec![(T * SEC, 97.5), (T * SEC + 500_000_000, 96.0)]);

    // Partial writes: the good lines are stored, the bad ones reported with their numbers.
    let mixed = format!(
        "good v=1 {t}\nno_fields\ngood v=oops {t}\ngood,host=a s=\"text\",v=2 {t}\ngood v=3 {t2}\n",
        t = T * SEC,
        t2 = (T + 1) * SEC
    );
    let a = writer.post("/write", mixed).await?;
    assert_eq!(a.status, 400);
    let err = a.json()?["error"].as_str().unwrap().to_string();
    assert!(err.starts_with("partial write:") && err.ends_with("dropped=3"), "{err}");
    assert!(err.contains("line 2:") && err.contains("line 3:") && err.contains("line 4:"), "{err}");
    assert!(err.contains("field \"s\" is a string"), "{err}");
    assert_eq!(
        read_values(&mut reader, "good.v", T * SEC, (T + 2) * SEC).await?,
        vec![(T * SEC, 1.0), ((T + 1) * SEC, 3.0)]
    );
    assert_eq!(read_values(&mut reader, "good.v{host=a}", T * SEC, (T + 2) * SEC).await?, vec![(T * SEC, 2.0)]);
    // The same in InfluxDB 2.x's shape.
    let a = writer.post("/api/v2/write?bucket=b", "broken").await?;
    assert_eq!(a.status, 400);
    let v = a.json()?;
    assert_eq!(v["code"], "invalid");
    assert!(v["message"].as_str().unwrap().contains("missing fields"), "{v}");

    // Prometheus remote write.
    let req = WriteRequest {
        timeseries: vec![TimeSeries {
            labels: [("__name__", "up"), ("job", "edge"), ("instance", "127.0.0.1:9100")]
                .iter()
                .map(|(n, v)| Label { name: n.to_string(), value: v.to_string() })
                .collect(),
            samples: (0..10i64).map(|i| Sample { value: (i % 2) as f64, timestamp: (T + i) * 1000 }).collect(),
        }],
    };
    let a = writer
        .send(
            hyper::Method::POST,
            "/api/v1/write",
            &[("content-encoding", "snappy"), ("content-type", "application/x-protobuf")],
            remote_write::encode(&req),
        )
        .await?;
    assert_eq!(a.status, 204, "{}", a.text());
    let got = read_values(&mut reader, "up{instance=127.0.0.1:9100,job=edge}", T * SEC, (T + 10) * SEC).await?;
    assert_eq!(got.len(), 10);
    assert_eq!(got[3], ((T + 3) * SEC, 1.0));

    // JSON API: windows, latest, series.
    let a = reader
        .get(&format!(
            "/v1/windows?series={}&start={}&end={}&width=1m",
            encode("pmu.phase{bus=2,site=bos}"),
            T * SEC,
            (T + 180) * SEC
        ))
        .await?;
    let w = a.json()?;
    assert_eq!(w["windows"].as_array().unwrap().len(), 3, "{w}");
    assert_eq!(w["windows"][1]["count"], 60);
    assert_eq!(w["windows"][1]["min"], 160.0);
    assert_eq!(w["windows"][1]["mean"], 189.5);
    let a = reader.get(&format!("/v1/latest?series={}", encode("pmu.phase{bus=2,site=bos}"))).await?;
    assert_eq!(a.json()?["point"], json!({"ts": (T + 179) * SEC, "value": 279.0, "event": 0}));
    let a = reader
        .get(&format!("/v1/latest?series={}&before={}", encode("pmu.phase{bus=2,site=bos}"), (T + 100) * SEC))
        .await?;
    assert_eq!(a.json()?["point"]["value"], 199.0);
    let a = reader.get("/v1/series?metric=pmu.&tag=site=atl").await?;
    assert_eq!(
        a.json()?["series"],
        json!(["pmu.phase.count{bus=1,site=atl}", "pmu.phase.ok{bus=1,site=atl}", "pmu.phase{bus=1,site=atl}"])
    );
    let a = reader.get("/v1/read?series=pmu.nothing&start=0&end=10").await?;
    assert_eq!(a.status, 404, "{}", a.text());

    // InfluxQL: windows merged across series unless grouped, times as asked.
    let q = format!(
        "SELECT mean(\"value\"), count(value), max(value) FROM \"pmu.phase\" WHERE time >= {}s AND time < {}s GROUP BY time(1m)",
        T,
        T + 120
    );
    let a = reader.get(&format!("/query?db=edge&epoch=s&q={}", encode(&q))).await?;
    assert_eq!(a.status, 200, "{}", a.text());
    let v = a.json()?;
    let expected_mean0 =
        ((0..60).map(|i| f64::from(i) + 0.5).sum::<f64>() + (100..160).map(f64::from).sum::<f64>()) / 120.0;
    assert_eq!(v["results"][0]["series"][0]["columns"], json!(["time", "mean", "count", "max"]));
    assert_eq!(
        v["results"][0]["series"][0]["values"],
        json!([[T, expected_mean0, 120, 159.0], [T + 60, expected_mean0 + 30.0, 120, 219.0]])
    );
    let q = "SELECT last(value) FROM \"pmu.phase\" WHERE site = 'bos' AND time >= '2023-11-14T22:13:00Z' GROUP BY site";
    let v = reader.get(&format!("/query?q={}", encode(q))).await?.json()?;
    let s = &v["results"][0]["series"][0];
    assert_eq!(s["tags"], json!({"site": "bos"}));
    assert_eq!(s["values"][0], json!(["2023-11-14T22:13:00Z", 279.0]));
    let q = "SELECT value FROM \"pmu.phase\" WHERE bus = '1' ORDER BY time DESC LIMIT 1; SHOW MEASUREMENTS; SHOW TAG VALUES FROM \"pmu.phase\" WITH KEY = site; SHOW DATABASES";
    // As the InfluxDB clients send it: a form body.
    let a = reader
        .send(
            hyper::Method::POST,
            "/query?epoch=ns",
            &[("content-type", "application/x-www-form-urlencoded")],
            format!("q={}", encode(q)),
        )
        .await?;
    let v = a.json()?;
    assert_eq!(v["results"][0]["series"][0]["values"], json!([[(T + 179) * SEC, 59.5]]), "{v}");
    assert_eq!(
        v["results"][1]["series"][0]["values"],
        json!([["cpu"], ["good"], ["pmu"], ["pmu.phase"], ["up"]]),
        "{v}"
    );
    assert_eq!(v["results"][2]["series"][0]["values"], json!([["site", "atl"], ["site", "bos"]]), "{v}");
    assert_eq!(v["results"][3]["series"][0]["values"], json!([["timeshard"]]), "{v}");
    // What Telegraf and the 1.x clients send at start-up: accepted, nothing to do.
    let q =
        "CREATE DATABASE \"telegraf\"; CREATE RETENTION POLICY \"a_year\" ON \"telegraf\" DURATION 52w REPLICATION 1";
    let a = reader
        .send(
            hyper::Method::POST,
            "/query",
            &[("content-type", "application/x-www-form-urlencoded")],
            format!("q={}", encode(q)),
        )
        .await?;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()?, json!({"results": [{"statement_id": 0}, {"statement_id": 1}]}));

    // /metrics counts what happened.
    let text = writer.get("/metrics").await?.text();
    let line =
        text.lines().find(|l| l.starts_with("timeshard_ingest_points_total{protocol=\"line_protocol\"}")).unwrap();
    assert_eq!(line.rsplit(' ').next(), Some("725"), "{line}");
    assert!(text.contains("timeshard_ingest_rejected_total{protocol=\"line_protocol\"} 4"), "{text}");
    for family in [
        "timeshard_store_open_points",
        "timeshard_store_open_blocks",
        "timeshard_hints_pending",
        "timeshard_repair_rounds_total",
        "timeshard_repair_fetched_bytes_total",
        "timeshard_repair_read_repairs_total",
        "timeshard_quic_connections",
        "timeshard_disk_size_bytes",
        "timeshard_disk_available_bytes",
    ] {
        assert!(text.contains(&format!("\n{family} ")), "{family} in {text}");
    }
    // The data directory's filesystem: some room left, no more than its size.
    let sample = |name: &str| -> f64 {
        let line = text.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap();
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let (size, available) = (sample("timeshard_disk_size_bytes"), sample("timeshard_disk_available_bytes"));
    assert!(available > 0.0 && available <= size, "available {available} of {size}");
    let text = reader.get("/metrics").await?.text();
    assert!(text.contains("timeshard_query_requests_total{kind=\"influxql\"} 4"), "{text}");

    assert_eq!(cluster.shutdown().await?, 3);
    Ok(())
}

/// `/v1/read` streams a range of any length in JSON columns, CSV, Arrow IPC or Parquet: more points than
/// `max_query_points`, over several batches, paged by `limit` and `next` without losing or
/// repeating one; ended quanta (their blocks sealed, sent packed) and live ones (near now).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_reads_stream_any_range_in_json_columns_csv_arrow_and_parquet() -> anyhow::Result<()> {
    const POINTS: i64 = 40_000;
    let (mut options, _dir) = ClusterOptions::for_tests(3, NODE);
    options.classes = vec![ClassConfig { name: "all".into(), rf: 3, w: 2, r: 2, ..Default::default() }];
    options.http.tokens = vec![TOKEN.into()];
    options.http.max_body_bytes = 8 << 20;
    options.http.max_query_points = 1_000;
    let cluster = LocalCluster::start_converged(options).await?;
    let mut writer = client(&cluster, 0).await?;
    let mut reader = client(&cluster, 2).await?;
    // Historical: a point every 10 ms from T, values with fractions.
    let value = |i: i64| i as f64 / 4.0;
    let body: String = (0..POINTS).map(|i| format!("h v={} {}\n", value(i), T * SEC + i * 10_000_000)).collect();
    let a = writer.post("/write", body).await?;
    assert_eq!(a.status, 204, "{}", a.text());
    let range = format!("series=h.v&start={}&end={}", T * SEC, (T + 1000) * SEC);

    let a = reader.get(&format!("/v1/read?{range}")).await?;
    assert_eq!(a.status, 200, "{}", &a.text()[..200]);
    assert_eq!(a.headers["content-type"], "application/json");
    let doc = a.json()?;
    assert!(doc["chunks"].as_array().unwrap().len() >= 3, "40,000 points in batches of 16,384");
    assert_eq!((doc["count"].as_i64(), &doc["next"]), (Some(POINTS), &Value::Null));
    let points = a.read_points()?;
    for (i, p) in points.iter().enumerate() {
        let i = i as i64;
        assert_eq!(p["ts"], T * SEC + i * 10_000_000, "{p}");
        assert_eq!(p["value"].as_f64(), Some(value(i)), "{p}");
    }

    // CSV: the same points as rows.
    let a = reader.get(&format!("/v1/read?{range}&format=csv")).await?;
    assert_eq!(a.status, 200);
    assert!(a.headers["content-type"].to_str()?.starts_with("text/csv"));
    let text = a.text();
    let mut rows = text.lines();
    assert_eq!(rows.next(), Some("ts,value,event"));
    let rows: Vec<&str> = rows.collect();
    assert_eq!(rows.len(), POINTS as usize);
    assert_eq!(rows[777], format!("{},194.25,0", T * SEC + 7_770_000_000));
    assert_eq!(rows[39_999], format!("{},9999.75,0", T * SEC + 399_990_000_000));

    // Pages of 15,000 (across the batches' edges), each continuing from the last one's cursor.
    let (mut paged, mut after, mut pages) = (Vec::new(), String::new(), 0);
    loop {
        let a = reader.get(&format!("/v1/read?{range}&limit=15000{after}")).await?;
        assert_eq!(a.status, 200, "{}", a.text());
        paged.extend(a.read_points()?);
        pages += 1;
        match a.json()?["next"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => break,
        }
    }
    assert_eq!((pages, paged.len()), (3, POINTS as usize));
    assert!(paged == points, "paging lost, repeated or changed points");
    // A limit the range ends at exactly has no cursor.
    let a = reader.get(&format!("/v1/read?{range}&limit={POINTS}")).await?;
    assert_eq!((a.read_points()?.len(), &a.json()?["next"]), (POINTS as usize, &Value::Null));

    // Live points, their quanta still open.
    let now = timeshard_clock::now_ns();
    let live: String = (0..3_000).map(|i| format!("l v={i} {}\n", now - 30 * SEC + i * 10_000_000)).collect();
    let a = writer.post("/write", live).await?;
    assert_eq!(a.status, 204, "{}", a.text());
    let a = reader.get("/v1/read?series=l.v&start=now-1m&end=now%2B1m&format=csv").await?;
    let got: Vec<f64> = a.text().lines().skip(1).map(|r| r.split(',').nth(1).unwrap().parse().unwrap()).collect();
    assert_eq!(got, (0..3_000).map(f64::from).collect::<Vec<_>>());
    let a = reader.get("/v1/read?series=l.v&start=now-1m&end=now%2B1m&limit=2000").await?;
    let next = a.json()?["next"].as_str().map(str::to_string).expect("a cursor");
    let a = reader.get(&format!("/v1/read?series=l.v&start=now-1m&end=now%2B1m&after={next}")).await?;
    assert_eq!(a.read_points()?.first().map(|p| p["value"].clone()), Some(json!(2000.0)));
    assert_eq!(a.read_points()?.len(), 1_000);

    // Parquet: the same points (one row group of 40,000; the row groups are unit-tested).
    let a = reader.get(&format!("/v1/read?{range}&format=parquet")).await?;
    assert_eq!((a.status.as_u16(), a.headers["content-type"].to_str()?), (200, "application/vnd.apache.parquet"));
    let file = parquet::file::reader::SerializedFileReader::new(a.body.clone())?;
    let meta = parquet::file::reader::FileReader::metadata(&file);
    assert_eq!(meta.file_metadata().num_rows(), POINTS);
    assert_eq!(meta.file_metadata().schema_descr().num_columns(), 3);

    // Arrow IPC: a stream of record batches, one per batch.
    let a = reader.get(&format!("/v1/read?{range}&format=arrow")).await?;
    assert_eq!(a.headers["content-type"], "application/vnd.apache.arrow.stream");
    let stream = arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(a.body.to_vec()), None)?;
    let batches = stream.collect::<Result<Vec<_>, _>>()?;
    assert_eq!(batches.iter().map(|b| b.num_rows() as i64).sum::<i64>(), POINTS);
    assert!(batches.len() >= 3, "{} record batches", batches.len());

    // A format that is none, and an unknown series, answer before anything streams.
    let a = reader.get(&format!("/v1/read?{range}&format=xml")).await?;
    assert_eq!(a.status, 400);
    assert!(error(a.json()?).contains("is not a format"));
    assert_eq!(reader.get("/v1/read?series=h.nothing&start=0&end=10").await?.status, 404);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_status_and_a_message() -> anyhow::Result<()> {
    let (cluster, _dir) = cluster(1, 64 * 1024).await?;
    let addr = cluster.http_addr(0).unwrap();
    let mut c = client(&cluster, 0).await?;

    // Tokens: none, wrong, and the open liveness check.
    let mut anonymous = HttpClient::connect(addr, None).await?;
    let a = anonymous.post("/write", "m v=1").await?;
    assert_eq!(a.status, 401);
    assert!(error(a.json()?).contains("needs a token"));
    let mut wrong = HttpClient::connect(addr, Some("not-the-token-0123456789")).await?;
    let a = wrong.get("/metrics").await?;
    assert_eq!(a.status, 401);
    assert!(error(a.json()?).contains("not one this node accepts"));
    assert_eq!(anonymous.get("/ping").await?.status, 204);
    // InfluxDB 2.x clients get the refusal in 2.x's shape.
    let a = wrong.post("/api/v2/write?org=o&bucket=b", "m v=1").await?;
    assert_eq!(a.status, 401);
    let v = a.json()?;
    assert_eq!(v["code"], "unauthorized", "{v}");
    assert!(v["message"].as_str().unwrap_or_default().contains("not one this node accepts"), "{v}");
    // Each refusal is counted (and logged with its source address).
    let text = c.get("/metrics").await?.text();
    assert!(text.contains("timeshard_auth_failures_total{door=\"http\"} 3"), "{text}");
    // InfluxDB 1.x clients send the token as the password.
    // A token in the URL is refused by default (URLs end up in logs).
    let a = anonymous.post(&format!("/write?u=x&p={TOKEN}"), "m v=1").await?;
    assert_eq!(a.status, 401);
    assert!(error(a.json()?).contains("tokens_in_urls"));

    // Malformed lines only: nothing stored, every line reported.
    let a = c.post("/write", "m\nm v=\nm,t v=1").await?;
    assert_eq!(a.status, 400);
    let e = error(a.json()?);
    assert!(e.contains("line 1: unable to parse 'm': missing fields") && e.ends_with("dropped=3"), "{e}");

    // A body over the limit: refused before it is read, so the connection closes (the answer
    // says so) and the client connects again.
    let big = "m v=1 1\n".repeat(10_000);
    let a = c.post("/write", big.clone()).await?;
    assert_eq!(a.status, 413);
    assert_eq!(a.headers["connection"], "close");
    assert!(error(a.json()?).contains("larger than this node's limit of 65536 bytes"));
    let mut c = client(&cluster, 0).await?;
    let a = c.post("/api/v2/write?org=o&bucket=b", big.clone()).await?;
    assert_eq!(a.status, 413);
    let mut c = client(&cluster, 0).await?;
    let v = a.json()?;
    assert_eq!(v["code"], "request too large", "{v}");
    assert!(v["message"].as_str().unwrap_or_default().contains("limit of 65536 bytes"), "{v}");
    // ... and one that only decompresses past it.
    let a = c.send(hyper::Method::POST, "/write", &[("content-encoding", "gzip")], gzip(big.as_bytes())).await?;
    assert_eq!(a.status, 413, "{}", a.text());
    let mut c = client(&cluster, 0).await?;

    // An unknown precision.
    let a = c.post("/write?precision=fortnight", "m v=1").await?;
    assert_eq!(a.status, 400);
    assert!(error(a.json()?).contains("unknown precision \"fortnight\""));

    // A compressed body that is not gzip, and an encoding that is not supported.
    let a = c.send(hyper::Method::POST, "/write", &[("content-encoding", "gzip")], "m v=1").await?;
    assert_eq!(a.status, 400);
    assert!(error(a.json()?).contains("not valid gzip"));
    let a = c.send(hyper::Method::POST, "/write", &[("content-encoding", "br")], "m v=1").await?;
    assert_eq!(a.status, 415);

    // Remote write that is not snappy, or not protobuf.
    let a = c.post("/api/v1/write", "plain text").await?;
    assert_eq!(a.status, 400);
    assert!(error(a.json()?).contains("not valid snappy"));
    let a = c.post("/api/v1/write", timeshard_formats::compression::snappy(b"\xff\xff\xff\xff garbage")).await?;
    assert_eq!(a.status, 400);
    assert!(error(a.json()?).contains("not a valid remote-write protobuf"));
    let a = c
        .send(
            hyper::Method::POST,
            "/api/v1/write",
            &[("content-type", "application/x-protobuf;proto=io.prometheus.write.v2.Request")],
            "x",
        )
        .await?;
    assert_eq!(a.status, 415);

    // Queries outside the subset, and broken ones.
    for (q, what) in [
        ("SELECT * FROM m", "SELECT *"),
        ("SELECT median(v) FROM m", "median()"),
        ("SELECT v FROM m WHERE host =~ /a/", "regular expressions"),
        ("DELETE FROM m", "DELETE statements"),
    ] {
        let a = c.get(&format!("/query?q={}", encode(q))).await?;
        assert_eq!(a.status, 400, "{q}");
        let e = error(a.json()?);
        assert!(e.starts_with("unsupported InfluxQL") && e.contains(what), "{q}: {e}");
    }
    // A window for every second since 1970 would be a row each: refused before anything runs.
    let a = c.get(&format!("/query?q={}", encode("SELECT count(v) FROM m WHERE time >= 0 GROUP BY time(1s)"))).await?;
    assert_eq!(a.status, 400);
    assert!(error(a.json()?).starts_with("the query is too large"));
    let a = c.get(&format!("/query?q={}", encode("SELECT FROM"))).await?;
    assert_eq!(a.status, 400);
    assert!(error(a.json()?).starts_with("error parsing query"));
    assert_eq!(c.get("/query").await?.status, 400);
    assert_eq!(c.get("/query?q=SHOW%20DATABASES&epoch=fortnight").await?.status, 400);

    // JSON API misuse.
    let a = c.get("/v1/read?series=bad%20key&start=0&end=1").await?;
    assert_eq!(a.status, 400);
    assert!(error(a.json()?).contains("invalid metric"));
    let a = c.get("/v1/read?series=m.v&start=yesterday&end=1").await?;
    assert_eq!(a.status, 400);
    // A time past the end of i64 nanoseconds overflowed (the handler panicked in a debug build).
    let a = c.get("/v1/read?series=m.v&start=0&end=now%2B9223372036854775807ns").await?;
    assert_eq!(a.status, 400, "{}", a.text());
    assert!(error(a.json()?).contains("cannot read time"));
    assert_eq!(c.get("/nowhere").await?.status, 404);

    // The node still serves.
    assert_eq!(c.post("/write", "m v=2 5").await?.status, 204);
    assert_eq!(read_values(&mut c, "m.v", 0, 10).await?, vec![(5, 2.0)]);
    assert_eq!(cluster.shutdown().await?, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_the_node_certificate_from_the_fleet_ca() -> anyhow::Result<()> {
    let (cluster, dir) = one_node(|http| http.tls = true).await?;
    let addr = cluster.http_addr(0).unwrap();
    let fleet = Identity::load(&cluster.client_tls())?.roots;

    // A client that trusts the fleet CA and checks the name node.timeshard writes and reads.
    let mut c = HttpClient::connect_tls(addr, fleet.clone(), Some(TOKEN)).await?;
    assert_eq!(c.get("/ping").await?.status, 204);
    assert_eq!(c.post("/write?precision=s", "tls,site=atl v=1.5 7").await?.status, 204);
    assert_eq!(read_values(&mut c, "tls.v{site=atl}", 0, 10 * SEC).await?, vec![(7 * SEC, 1.5)]);
    // Tokens are still checked over TLS.
    let mut wrong = HttpClient::connect_tls(addr, fleet, Some("not-the-token-0123456789")).await?;
    assert_eq!(wrong.get("/metrics").await?.status, 401);

    // A client that trusts another CA refuses the node, and plain HTTP gets no answer.
    let other = timeshard_node::pki::dev_pki(&dir.path().join("other-pki"), 1)?;
    let other = Identity::load(&TlsFiles::in_dir(&other, "node-0"))?.roots;
    let refused = HttpClient::connect_tls(addr, other, Some(TOKEN)).await.unwrap_err();
    assert!(format!("{refused:#}").contains("certificate"), "{refused:#}");
    let mut plain = HttpClient::connect(addr, Some(TOKEN)).await?;
    assert!(plain.get("/ping").await.is_err());

    assert_eq!(cluster.shutdown().await?, 1);
    Ok(())
}

/// Reads one HTTP/1.1 answer (headers and a body of `content-length`) from a raw connection.
async fn raw_answer(tcp: &mut tokio::net::TcpStream) -> anyhow::Result<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string()))
                .and_then(|v| v.parse::<usize>().ok());
            if length.is_some_and(|n| body.len() >= n) {
                return Ok(text);
            }
        }
        let n = tcp.read(&mut chunk).await?;
        if n == 0 {
            return Ok(String::from_utf8_lossy(&buf).into_owned());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_limits_are_refused_in_time() -> anyhow::Result<()> {
    let timeout = Duration::from_secs(3);
    let (cluster, _dir) = one_node(|http| {
        http.max_concurrent_requests = 1;
        http.request_timeout = timeout;
        http.body_timeout = timeout;
        http.max_query_points = 100;
    })
    .await?;
    let addr = cluster.http_addr(0).unwrap();

    // A client that sends its headers and part of its body, then stalls, holds no slot: its
    // body is read before it takes one.
    let mut stalled = tokio::net::TcpStream::connect(addr).await?;
    let started = Instant::now();
    stalled
        .write_all(
            format!(
                "POST /write HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {TOKEN}\r\ncontent-length: 1000\r\n\r\nm v=1 1\n"
            )
            .as_bytes(),
        )
        .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut c = client(&cluster, 0).await?;
    let a = c.get("/metrics").await?;
    assert_eq!(a.status, 200, "{}", a.text());

    // The stalled request is ended at the body timeout, with an answer that says so.
    let answer = tokio::time::timeout(Duration::from_secs(20), raw_answer(&mut stalled)).await??;
    let took = started.elapsed();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("did not arrive within 3s"), "{answer}");
    assert!(took >= timeout && took < timeout + Duration::from_secs(5), "{took:?}");

    // Nothing of the stalled body was stored.
    let a = c.get("/metrics").await?;
    assert_eq!(a.status, 200, "{}", a.text());
    assert!(a.text().contains("timeshard_http_responses_total{code=\"4xx\"} 1"), "{}", a.text());
    assert_eq!(c.get("/v1/read?series=m.v&start=0&end=10").await?.status, 404);

    // Raw points a query may answer, counted over all its series: 2 x 60 is more than 100.
    let body: String = (0..60).flat_map(|i| [format!("m,s=a v={i} {i}\n"), format!("m,s=b v={i} {i}\n")]).collect();
    assert_eq!(c.post("/write", body).await?.status, 204);
    let a = c.get(&format!("/query?q={}", encode("SELECT v FROM m WHERE s = 'a'"))).await?;
    assert_eq!(a.json()?["results"][0]["series"][0]["values"].as_array().map(Vec::len), Some(60));
    let a = c.get(&format!("/query?q={}", encode("SELECT v FROM m"))).await?;
    assert_eq!(a.status, 200);
    let e = a.json()?["results"][0]["error"].as_str().unwrap_or_default().to_string();
    assert!(e.contains("more than 100 raw points ([http] max_query_points)"), "{e}");
    // A raw read streams instead: past the limit, and whole.
    let a = c.get("/v1/read?series=m.v%7Bs%3Da%7D&start=0&end=100&limit=101").await?;
    assert_eq!(a.read_points()?.len(), 60, "{}", a.text());
    assert_eq!(c.get("/v1/read?series=m.v%7Bs%3Da%7D&start=0&end=100&limit=0").await?.status, 400);
    assert_eq!(cluster.shutdown().await?, 1);
    Ok(())
}

/// A node with no `[http] tokens` makes one at its first start (`<data_dir>/http.token`, mode
/// 0600), requires it on loopback too, and keeps it across restarts; `anonymous = true` is the
/// explicit way back to a loopback listener without tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_tokens_makes_one_and_requires_it() -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let (mut cluster, _dir) = one_node(|http| http.tokens.clear()).await?;
    let path = cluster.data_dir(0).join(timeshard_node::start::HTTP_TOKEN_FILE);
    assert_eq!(std::fs::metadata(&path)?.permissions().mode() & 0o777, 0o600);
    let token = std::fs::read_to_string(&path)?.trim().to_string();
    assert!(token.len() >= 32, "{token}");
    let addr = cluster.http_addr(0).unwrap();
    let a = HttpClient::connect(addr, None).await?.post("/write", "m v=1").await?;
    assert_eq!(a.status, 401);
    assert!(error(a.json()?).contains("http.token"));
    assert_eq!(HttpClient::connect(addr, Some(&token)).await?.post("/write", "m v=1").await?.status, 204);
    assert!(cluster.terminate(0).await?);
    cluster.restart(0).await?;
    assert_eq!(std::fs::read_to_string(&path)?.trim(), token, "the token survives a restart");
    let addr = cluster.http_addr(0).unwrap();
    assert_eq!(HttpClient::connect(addr, Some(&token)).await?.post("/write", "m v=2").await?.status, 204);

    let (anonymous, _dir) = one_node(|http| {
        http.tokens.clear();
        http.anonymous = true;
    })
    .await?;
    let addr = anonymous.http_addr(0).unwrap();
    assert_eq!(HttpClient::connect(addr, None).await?.post("/write", "m v=1").await?.status, 204);
    assert!(!anonymous.data_dir(0).join(timeshard_node::start::HTTP_TOKEN_FILE).exists());
    Ok(())
}
