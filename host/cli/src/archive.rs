//! `timeshard archive status`: the cold tier as one node sees it: what the archive holds per
//! class, what this node exported and still has pending, and its last error.

use std::time::Duration;

use anyhow::Result;
use clap::{Args, Subcommand};
use timeshard_clock::now_ns;
use timeshard_sdk::ArchiveReport;

use crate::conn::ConnArgs;

const STATUS_ABOUT: &str = "\
Show the cold tier as one node sees it: per class, what the archive holds (days, exports,
bytes: every node's), what this node exported, dropped and still has pending, and the last
error of its export rounds. Lists the whole archive.

Examples:
  timeshard archive status
  timeshard archive status --json | jq '.classes[] | {class, pending_blocks}'";

/// The archive commands.
#[derive(Debug, Subcommand)]
pub(crate) enum ArchiveCommand {
    #[command(about = "What the archive holds, what this node has pending, and its last error", long_about = STATUS_ABOUT)]
    Status(StatusArgs),
}

/// Options of `archive status`.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(cmd: ArchiveCommand) -> Result<()> {
    let ArchiveCommand::Status(args) = cmd;
    let client = args.conn.connect().await?;
    let report = client.archive_status().await?;
    client.close().await;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report, now_ns()));
    }
    Ok(())
}

fn duration(ns: i64) -> String {
    let secs = u64::try_from(ns / 1_000_000_000).unwrap_or(0);
    humantime::format_duration(Duration::from_secs(secs)).to_string()
}

fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

/// The report as text.
fn render(r: &ArchiveReport, now: i64) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    if r.url.is_empty() {
        let _ = writeln!(out, "archive: none (this node has no [tier] url)");
    } else {
        let _ = writeln!(out, "archive: {}", r.url);
    }
    if let Some(e) = &r.listing_error {
        let _ = writeln!(out, "  cannot list it now: {e}");
    }
    for c in &r.classes {
        if !c.archive && c.exports == 0 && c.expired_blocks == 0 && c.expired_files == 0 {
            continue;
        }
        let how = if c.archive {
            format!("archived after {} by {} time", duration(c.hot_ns), c.age_by)
        } else {
            "not archived".into()
        };
        let _ = writeln!(out, "class {}: {how}", c.class);
        if c.exports > 0 {
            let _ = writeln!(
                out,
                "  in the archive: {} day(s) ({} .. {}), {} export(s), {} of points, {} of manifests",
                c.days,
                c.first_day,
                c.last_day,
                c.exports,
                bytes(c.points_bytes),
                bytes(c.manifest_bytes)
            );
        }
        let _ = writeln!(
            out,
            "  this node: exported {} block(s) ({} rows, {}) in {} file(s); dropped {} hot cop(ies); pending {} \
             ({} waiting for another owner)",
            c.exported_blocks,
            c.exported_rows,
            bytes(c.exported_bytes),
            c.exported_files,
            c.dropped_blocks,
            c.pending_blocks,
            c.waiting_for_owner
        );
        if c.expired_blocks > 0 {
            let _ = writeln!(out, "  expired by write-time retention: {} block(s)", c.expired_blocks);
        }
        if c.expired_files > 0 {
            let _ = writeln!(out, "  archive files removed past retention: {}", c.expired_files);
        }
    }
    let _ = writeln!(
        out,
        "uncommitted points files: {}; manifests without points: {}",
        r.uncommitted_total, r.dangling_total
    );
    for f in r.uncommitted.iter().chain(&r.dangling) {
        let _ = writeln!(out, "  {f}");
    }
    if r.refused_manifests > 0 {
        let _ = writeln!(
            out,
            "manifests refused (their seal does not check; their blocks are not read): {}",
            r.refused_manifests
        );
        for f in &r.refused {
            let _ = writeln!(out, "  {f}");
        }
    }
    if r.legacy_exports > 0 {
        let _ = writeln!(out, "exports from before node folders (unsealed, read as unverified): {}", r.legacy_exports);
    }
    if r.last_round_ns > 0 {
        let _ = writeln!(out, "last round: {} ago", duration(now - r.last_round_ns));
    }
    match &r.last_error {
        Some(e) => {
            let _ = writeln!(out, "last error ({} ago): {e}", duration(now - r.last_error_ns));
            if r.failed_rounds > 0 {
                let _ = writeln!(
                    out,
                    "  {} round(s) failed in a row; hot data is kept until the archive holds it",
                    r.failed_rounds
                );
            }
        }
        None => {
            let _ = writeln!(out, "last error: none");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use timeshard_sdk::ArchiveClassReport;

    #[test]
    fn the_report_reads_as_text() {
        let r = ArchiveReport {
            url: "s3://bkt/ts".into(),
            classes: vec![ArchiveClassReport {
                class: "pmu".into(),
                archive: true,
                hot_ns: 86_400 * 1_000_000_000,
                age_by: "event".into(),
                days: 2,
                first_day: "2023-11-14".into(),
                last_day: "2023-11-15".into(),
                exports: 3,
                points_bytes: 3 << 20,
                pending_blocks: 7,
                ..ArchiveClassReport::default()
            }],
            uncommitted: vec!["node=n/points/class=pmu/day=2023-11-15/n-0000000002.parquet".into()],
            uncommitted_total: 1,
            last_round_ns: 1_000_000_000,
            last_error: Some("object store failed".into()),
            last_error_ns: 1_000_000_000,
            failed_rounds: 2,
            ..ArchiveReport::default()
        };
        let text = render(&r, 61_000_000_000);
        for want in [
            "archive: s3://bkt/ts",
            "class pmu: archived after 1day by event time",
            "2 day(s) (2023-11-14 .. 2023-11-15), 3 export(s), 3.0 MiB of points",
            "pending 7",
            "uncommitted points files: 1",
            "last error (1m ago): object store failed",
            "2 round(s) failed",
        ] {
            assert!(text.contains(want), "{want:?} missing in:\n{text}");
        }
    }
}
