//! `timeshard status`: what one node knows of itself and the cluster.

use anyhow::Result;

use crate::conn::ConnArgs;

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
