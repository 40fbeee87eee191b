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
    if s.config_generation == 0 {
        println!("configuration: by hand (not enrolled), digest {:016x}", s.config_digest);
    } else {
        println!("configuration: generation {}, digest {:016x}", s.config_generation, s.config_digest);
    }
    client.close().await;
    Ok(())
}
