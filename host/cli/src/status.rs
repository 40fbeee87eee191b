//! `timeshard status`: what one node knows of itself and the cluster.

use anyhow::Result;
use timeshard_proto::wire::StorageStatus;

use crate::conn::ConnArgs;

/// Disk, quotas, export backlog and the control plane's last answer.
fn storage(s: &StorageStatus) {
    let mib = |b: u64| b >> 20;
    if s.disk_size_bytes > 0 {
        let limit = match s.store_max_bytes {
            0 => String::new(),
            max => format!("; the store may hold {} MiB ([store] max_bytes)", mib(max)),
        };
        println!(
            "disk: {} MiB of {} MiB available ({}% used){limit}",
            mib(s.disk_available_bytes),
            mib(s.disk_size_bytes),
            100 - s.disk_available_bytes.saturating_mul(100) / s.disk_size_bytes
        );
    }
    for c in &s.classes {
        println!(
            "class {}: {} of {} bytes ({}%), on_full = {}{}; {} blocks ({} points) evicted since start",
            c.class,
            c.used_bytes,
            c.quota_bytes,
            c.used_bytes.saturating_mul(100) / c.quota_bytes.max(1),
            c.on_full,
            if c.refusing { ", REFUSING WRITES" } else { "" },
            c.evicted_blocks,
            c.evicted_points
        );
    }
    let ago = |ms: u64| (now_ms().saturating_sub(ms)) / 1000;
    if s.export_pending_blocks > 0 || s.export_failed_rounds > 0 || s.export_last_success_ms > 0 {
        let last = match s.export_last_success_ms {
            0 => "no round has succeeded since start".to_string(),
            ms => format!("last success {} s ago", ago(ms)),
        };
        let behind = match s.export_oldest_due_ms {
            0 => String::new(),
            ms => format!(", the oldest due {} s ago", ago(ms)),
        };
        println!(
            "archive export: {} blocks ({} points, {} bytes) waiting{behind}, {} rounds failed in a row, {last}{}",
            s.export_pending_blocks,
            s.export_pending_points,
            s.export_pending_bytes,
            s.export_failed_rounds,
            s.export_last_error.as_ref().map(|e| format!("; last error: {e}")).unwrap_or_default()
        );
    }
    if s.control_plane_contact_ms > 0 {
        println!("control plane: last answered {} s ago", ago(s.control_plane_contact_ms));
    }
}

fn now_ms() -> u64 {
    u64::try_from(timeshard_clock::now_ns() / 1_000_000).unwrap_or(0)
}

pub(crate) async fn run(args: ConnArgs) -> Result<()> {
    let client = args.connect().await?;
    let s = client.status().await?;
    println!("node {} at {} (version {}), knows {} peers", s.id, s.addr, s.version, s.peers);
    println!(
        "members: {} up, {} down, {} gone (view generation {})",
        s.members_up, s.members_down, s.members_gone, s.view_generation
    );
    println!(
        "hints: {} pending ({} bytes), {} replayed, {} dropped; replica writes in flight: {}",
        s.hints_pending, s.hints_pending_bytes, s.hints_replayed, s.hints_dropped, s.replica_writes_in_flight
    );
    let r = &s.repair;
    println!(
        "repair: {}{}; {} anti-entropy rounds, {} sessions run, {} served, {} bytes compared; {} blocks ({} bytes) \
         fetched",
        if r.settled { "settled" } else { "catching up (reads count on other replicas)" },
        if r.leaving { ", leaving" } else { "" },
        r.rounds,
        r.sessions,
        r.sessions_served,
        r.compare_bytes,
        r.blocks_fetched,
        r.bytes_fetched
    );
    println!(
        "handoff: {} blocks pending, {} pushed ({} bytes), {} dropped; read repairs: {} sent, {} dropped",
        r.handoff_pending,
        r.handoff_blocks_pushed,
        r.handoff_bytes_pushed,
        r.handoff_blocks_dropped,
        r.read_repairs_sent,
        r.read_repairs_dropped
    );
    if r.leaving {
        println!(
            "leaving: {} of {} blocks handed off ({} bytes pushed){}",
            r.leave.blocks_done,
            r.leave.blocks_total,
            r.leave.bytes_pushed,
            if r.leave.left { "; left" } else { "" }
        );
    }
    println!("write-ahead log: {} bytes", s.wal_bytes);
    storage(&s.storage);
    if s.config_generation == 0 {
        println!("configuration: by hand (not enrolled), digest {:016x}", s.config_digest);
    } else {
        println!("configuration: generation {}, digest {:016x}", s.config_generation, s.config_digest);
    }
    if !s.policies.is_empty() {
        println!("policies (since installed):");
        for p in &s.policies {
            let state = if p.current { "" } else { ", previous version kept for queries" };
            println!(
                "  {}@{} ({}{state}): {} calls, {:.3} s, peak memory {} KiB, {} traps, {} timeouts, {} other failures{}",
                p.name,
                p.version,
                p.kind,
                p.calls,
                p.time_us as f64 / 1e6,
                p.peak_memory_bytes / 1024,
                p.traps,
                p.timeouts,
                p.failures,
                if p.kind == "ingest" {
                    format!(", {} of {} points refused", p.rejected, p.points)
                } else {
                    String::new()
                },
            );
        }
    }
    client.close().await;
    Ok(())
}
