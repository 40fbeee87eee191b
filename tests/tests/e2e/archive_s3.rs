//! End to end on a real S3-compatible server: moto's (PyPI `moto[server]`), started on
//! loopback by the test and stopped at its end. An export is cut by a crash mid-upload, re-run,
//! and everything reads back; multipart uploads, listings, ranged reads and cleanup all go
//! through S3's API.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::ObjectStore;
use timeshard_proto::TimeRange;
use timeshard_tier::faulty::{Fault, FaultyStore};
use timeshard_tier::{Archive, Location};

use crate::archive_support::*;
use crate::tier_support::Moto;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_archive_works_on_an_s3_compatible_server() {
    let mut moto = Moto::reserve();
    moto.start("timeshard-tier").unwrap();
    let url = "s3://timeshard-tier/archive/v1";
    let class = class("pmu", 10);
    // Enough 60 Hz data in one day for a file of several 5 MiB parts (S3's smallest part).
    let start = T0 - T0.rem_euclid(DAY) + DAY;
    let data: Vec<_> = (1..=2u64)
        .map(|b| (series(&format!("pmu.phase{{bus={b}}}")), signal_points(b, start, 60, 6 * 3600 * 60)))
        .collect();
    let hot = hot_store(class.quantum, &data);
    let blocks = hot_blocks(&*hot);
    let mut config = quick_config("node-s3");
    config.export.part_bytes = 5 << 20;
    config.export.row_group_rows = 256 * 1024;

    // A crash in the middle of the multipart upload of the points file.
    let s3 = Location::parse(url).unwrap().open(&moto.options(), Duration::from_secs(10)).unwrap();
    let rehearsal = FaultyStore::new(Arc::new(object_store::memory::InMemory::new()));
    Archive::with_store(Arc::new(rehearsal.clone()) as Arc<dyn ObjectStore>, config.clone())
        .unwrap()
        .export(hot.clone(), &class, blocks.clone())
        .await
        .unwrap();
    let log = rehearsal.log();
    let parts: Vec<usize> =
        log.iter().enumerate().filter(|(_, op)| op.starts_with("put_part")).map(|(i, _)| i).collect();
    assert!(parts.len() >= 2, "the file goes up in several parts: {log:?}");
    let faulty = FaultyStore::new(Arc::clone(&s3));
    faulty.set_fault(Fault::FailFrom(parts[1] as u64 + 1));
    let dying = Archive::with_store(Arc::new(faulty) as Arc<dyn ObjectStore>, config.clone()).unwrap();
    assert!(dying.export(hot.clone(), &class, blocks.clone()).await.is_err());

    let archive = Archive::open_with_options(url, &moto.options(), config.clone()).unwrap();
    assert!(archive.status().await.unwrap().classes.is_empty(), "nothing was committed");
    let report = archive.export(hot.clone(), &class, blocks.clone()).await.unwrap();
    assert_eq!(report.confirmed.len(), blocks.len());
    assert_eq!(report.files.len(), 1);
    assert!(report.bytes > 5 << 20, "{} bytes", report.bytes);

    // A fresh handle (another node) reads everything back from S3.
    let reader = Archive::open_with_options(url, &moto.options(), quick_config("reader")).unwrap();
    let range = TimeRange::new(start - DAY, start + DAY).unwrap();
    for (s, points) in &data {
        assert_eq!(&read_all(&reader, &class, s, range, 200_000).await, points);
        assert_same_aggregates(&reader, &*hot, &class, s, range, 3600 * SEC).await;
        let cut = TimeRange::new(start + 1_000 * SEC + 3, start + 1_100 * SEC).unwrap();
        assert_same_aggregates(&reader, &*hot, &class, s, cut, SEC).await;
    }
    let asked: Vec<_> = report.confirmed.iter().map(|c| (c.series.clone(), c.quantum, c.digest)).collect();
    assert!(reader.confirmed(&class, &asked).await.unwrap().iter().all(|&c| c));
    let status = reader.status().await.unwrap();
    assert_eq!(status.classes[0].exports, 1);
    assert!(status.uncommitted.is_empty() && status.dangling.is_empty(), "{status:?}");
    assert_eq!(reader.cleanup(Duration::ZERO).await.unwrap().removed, Vec::<String>::new());

    // The objects sit under the URL's prefix.
    let raw = Location::parse("s3://timeshard-tier").unwrap().open(&moto.options(), Duration::from_secs(10)).unwrap();
    let listed: Vec<_> = futures::TryStreamExt::try_collect::<Vec<_>>(raw.list(None)).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|m| m.location.as_ref().starts_with("archive/v1/")), "{listed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_fails_exports_with_a_clear_error() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let options: Vec<(String, String)> = [
        ("aws_endpoint", format!("http://127.0.0.1:{port}")),
        ("aws_access_key_id", "testing".into()),
        ("aws_secret_access_key", "testing".into()),
        ("aws_region", "us-east-1".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let mut config = quick_config("n");
    config.retry.attempts = 2;
    let archive = Archive::open_with_options("s3://nowhere/x", &options, config).unwrap();
    let class = class("c", 10);
    let hot = hot_store(class.quantum, &[(series("m"), signal_points(1, T0, 1, 100))]);
    let t = Instant::now();
    let err = archive.export(hot.clone(), &class, hot_blocks(&*hot)).await.unwrap_err();
    assert!(matches!(err, timeshard_tier::Error::Store { .. }), "{err}");
    assert!(err.to_string().contains("list"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(60), "gave up in bounded time: {:?}", t.elapsed());
    assert!(
        Archive::open_with_options("s3://b/x", &[("no_such_option".into(), "1".into())], quick_config("n")).is_err()
    );
}
