//! What checking signed membership costs: a node checks a heartbeat that advanced on a chain it
//! verified with a hash or two, the signature of an entry that changed, and the certificate
//! chain of an entry whose certificate it has not verified yet. Measured in-process on the
//! development PKI's keys (the control plane's are of the same kind, ECDSA P-256), for
//! `timeshard bench paper`'s JSON.

use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::json;
use timeshard_node::attest::Attest;
use timeshard_node::pki;
use timeshard_proto::membership::{GossipEntry, Member};
use timeshard_sdk::tls::{Identity, TlsFiles};

/// Entries checked per measurement.
const ENTRIES: u64 = 2_000;
/// Entries that changed (each signed anew) per measurement.
const CHANGED: u64 = 200;
/// Checkers started afresh (no chain remembered) to measure a first entry.
const COLD: usize = 50;

/// In microseconds, medians of `runs`: `gossip_verify_us_per_entry` (heartbeats that advanced,
/// as gossip brings them: the beat chain's hashes, and a signature per chain),
/// `gossip_verify_changed_entry_us` (an entry that changed: a signature check, the certificate
/// known) and `gossip_verify_first_entry_us` (certificate chain and signature).
pub fn gossip_verify(runs: usize) -> Result<serde_json::Value> {
    let dir = tempfile::tempdir()?;
    pki::dev_pki(dir.path(), 2)?;
    let signer_id = Identity::load(&TlsFiles::in_dir(dir.path(), "node-0"))?;
    let checker_id = Identity::load(&TlsFiles::in_dir(dir.path(), "node-1"))?;
    let skew = Duration::from_secs(300);
    let signer = Attest::new(&signer_id, skew)?;
    let now = u64::try_from(timeshard_clock::now_ns())?;
    let entries: Vec<GossipEntry> = (1..=ENTRIES)
        .map(|heartbeat| {
            let mut member =
                Member::new(signer_id.id().expect("an id"), "127.0.0.1:7400".parse().expect("literal"), now);
            member.heartbeat = heartbeat;
            let proof = signer.sign(&member);
            GossipEntry { member, age_ms: 0, proof, seen_at: None }
        })
        .collect();
    let changed: Vec<GossipEntry> = (1..=CHANGED)
        .map(|digest| {
            let mut member =
                Member::new(signer_id.id().expect("an id"), "127.0.0.1:7400".parse().expect("literal"), now);
            (member.heartbeat, member.config_digest) = (ENTRIES + digest, digest);
            let proof = signer.sign(&member);
            GossipEntry { member, age_ms: 0, proof, seen_at: None }
        })
        .collect();
    let (mut warm, mut signed, mut cold) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs.max(1) {
        let checker = Attest::new(&checker_id, skew)?;
        checker.check(&entries[0], now).map_err(|r| anyhow::anyhow!("entry refused: {r:?}"))?;
        let t = Instant::now();
        for e in &entries[1..] {
            checker.check(e, now).map_err(|r| anyhow::anyhow!("entry refused: {r:?}"))?;
        }
        warm.push(t.elapsed().as_secs_f64() * 1e6 / (ENTRIES - 1) as f64);
        let t = Instant::now();
        for e in &changed {
            checker.check(e, now).map_err(|r| anyhow::anyhow!("entry refused: {r:?}"))?;
        }
        signed.push(t.elapsed().as_secs_f64() * 1e6 / CHANGED as f64);
        let t = Instant::now();
        for _ in 0..COLD {
            let fresh = Attest::new(&checker_id, skew)?;
            fresh.check(&entries[0], now).map_err(|r| anyhow::anyhow!("entry refused: {r:?}"))?;
        }
        cold.push(t.elapsed().as_secs_f64() * 1e6 / COLD as f64);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2] * 10.0).round() / 10.0
    };
    let (warm, signed, cold) = (median(&mut warm), median(&mut signed), median(&mut cold));
    println!(
        "gossip entry check: {warm} us (heartbeat advanced), {signed} us (entry changed), {cold} us (first entry of a certificate, checker set up included)"
    );
    Ok(json!({
        "gossip_verify_us_per_entry": warm, "gossip_verify_changed_entry_us": signed,
        "gossip_verify_first_entry_us": cold, "entries": ENTRIES, "changed_entries": CHANGED, "runs": runs,
    }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_gossip_check_benchmark_reports_both_costs() {
        let doc = super::gossip_verify(1).unwrap();
        let warm = doc["gossip_verify_us_per_entry"].as_f64().unwrap();
        let signed = doc["gossip_verify_changed_entry_us"].as_f64().unwrap();
        let cold = doc["gossip_verify_first_entry_us"].as_f64().unwrap();
        assert!(warm > 0.0 && signed > warm && cold > warm, "{doc}");
    }
}
