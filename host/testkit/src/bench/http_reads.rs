//! Raw reads over HTTP (`/v1/read`, streamed) of one sealed `pmu` series, in each format the
//! node offers, beside the SDK's streamed read of the same ranges over QUIC in the same run
//! (the floor an HTTP read adds its encoding to): `read_http_{10s,150s,1h,day}_ms` for JSON,
//! `read_http_{csv,arrow,parquet}_{..}_ms` for the other formats, `read_sdk_{..}_ms`, and
//! `read_http_day_rss_mb`, the node's peak resident memory while it answered the day.
//!
//! Each figure is the median of several reads after one that is not counted (its blocks come
//! off disk into the page cache); a range longer than the data written is left out. Every
//! answer's point count is checked. The client holds each answer whole (as a program saving
//! it would not), counting its points off the bytes without parsing the JSON.

use std::net::SocketAddr;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use serde_json::{Map, Value, json};
use timeshard_proto::{SeriesKey, TimeRange};

use crate::cluster::HTTP_TOKEN;
use crate::datasets::pmu_ts;
use crate::http_client::{HttpClient, encode};
use crate::stats::{Latencies, round3};

/// The ranges read, by the name their keys carry.
const RANGES: [(&str, i64); 4] = [("10s", 10), ("150s", 150), ("1h", 3_600), ("day", 86_400)];

/// The formats read, by the prefix of their keys.
const FORMATS: [(&str, &str); 4] =
    [("json", "read_http"), ("csv", "read_http_csv"), ("arrow", "read_http_arrow"), ("parquet", "read_http_parquet")];

/// Points of a `/v1/read` answer, read off its bytes: JSON's closing `count`, CSV's rows, the
/// rows of Arrow's record batches, or those Parquet's footer counts.
fn answer_points(body: &[u8], format: &str) -> Result<u64> {
    match format {
        "csv" => return Ok(body.iter().filter(|&&b| b == b'\n').count().saturating_sub(1) as u64),
        "arrow" => {
            let stream = arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(body), None)?;
            let mut rows = 0;
            for batch in stream {
                rows += batch?.num_rows() as u64;
            }
            return Ok(rows);
        }
        "parquet" => {
            use parquet::file::reader::{FileReader, SerializedFileReader};
            let file = SerializedFileReader::new(bytes::Bytes::copy_from_slice(body))?;
            return Ok(file.metadata().file_metadata().num_rows() as u64);
        }
        _ => {}
    }
    let tail = &body[body.len().saturating_sub(200)..];
    let tail = std::str::from_utf8(tail).unwrap_or_default();
    let count = tail.rsplit_once("\"count\":").context("a JSON answer without its count: cut off?")?.1;
    Ok(count.split(',').next().unwrap_or_default().trim().parse()?)
}

/// Reads of `series` (60 Hz from the dataset's start, `seconds` of it) over HTTP at `addr` and
/// through `sdk`; `peak_mb` gives the node's peak memory since it was last asked.
pub async fn measure(
    addr: SocketAddr,
    sdk: &timeshard_sdk::Client,
    series: &str,
    seconds: i64,
    reps: usize,
    mut peak_mb: impl FnMut() -> Result<f64>,
) -> Result<Map<String, Value>> {
    let mut http = HttpClient::connect(addr, Some(HTTP_TOKEN)).await?;
    let key: SeriesKey = series.parse()?;
    let mut doc = Map::new();
    for (name, secs) in RANGES.into_iter().filter(|&(_, s)| s <= seconds) {
        let points = (secs * 60) as u64;
        let (start, end) = (pmu_ts(0), pmu_ts(points));
        // The day is read fewer times: each read moves a few hundred megabytes.
        let reps = if secs > 3_600 { reps.min(3) } else { reps };
        if name == "day" {
            peak_mb()?;
        }
        for (format, prefix) in FORMATS {
            let path = format!("/v1/read?series={}&start={start}&end={end}&format={format}", encode(series));
            let mut lat = Latencies::default();
            for rep in 0..=reps {
                let t = Instant::now();
                let a = http.get(&path).await?;
                let took = t.elapsed();
                if a.status != 200 {
                    bail!("/v1/read of {name} answered {}: {}", a.status, a.text());
                }
                let got = answer_points(&a.body, format)?;
                if got != points {
                    bail!("/v1/read of {name} in {format} answered {got} points of {points}");
                }
                if rep > 0 {
                    lat.push(took);
                }
            }
            doc.insert(format!("{prefix}_{name}_ms"), json!(round3(lat.percentile_ms(50.0))));
        }
        if name == "day" {
            doc.insert("read_http_day_rss_mb".into(), json!(peak_mb()?));
        }
        let range = TimeRange::new(start, end)?;
        let mut lat = Latencies::default();
        for rep in 0..=reps {
            let t = Instant::now();
            let mut got = 0u64;
            let mut batches = std::pin::pin!(sdk.read_stream(&key, range));
            while let Some(batch) = batches.next().await {
                got += batch?.len() as u64;
            }
            if got != points {
                bail!("the SDK's read of {name} returned {got} points of {points}");
            }
            if rep > 0 {
                lat.push(t.elapsed());
            }
        }
        doc.insert(format!("read_sdk_{name}_ms"), json!(round3(lat.percentile_ms(50.0))));
        println!(
            "raw read of {name} ({points} points): HTTP JSON {} ms, CSV {} ms, Arrow {} ms, Parquet {} ms; SDK {} ms",
            doc[&format!("read_http_{name}_ms")],
            doc[&format!("read_http_csv_{name}_ms")],
            doc[&format!("read_http_arrow_{name}_ms")],
            doc[&format!("read_http_parquet_{name}_ms")],
            doc[&format!("read_sdk_{name}_ms")]
        );
    }
    Ok(doc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_are_counted_off_the_answer() {
        assert_eq!(answer_points(b"ts,value,event\n1,2,0\n3,4,0\n", "csv").unwrap(), 2);
        let json = br#"{"series":"m","chunks":[{"ts":[1],"value":[2],"event":[0]}],"count":1,"next":null}"#;
        assert_eq!(answer_points(json, "json").unwrap(), 1);
        assert!(answer_points(br#"{"series":"m","chunks":[{"ts":[1],"#, "json").is_err());
        assert!(answer_points(b"PAR1", "parquet").is_err());
    }
}
