//! `timeshard status`: what one node knows of itself and the cluster.

use anyhow::Result;

use crate::conn::ConnArgs;

pub(crate) async fn run(args: ConnArgs) -> Result<()> {
    let client = args.connect().await?;
    let s = client.status().await?;
    println!("node {} at {} (version {}), knows {} peers", s.id, s.addr, s.version, s.peers);
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
