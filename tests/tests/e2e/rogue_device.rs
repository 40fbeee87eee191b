//! A rogue device: a valid node certificate of the fleet's CA, never a member.
//!
//! It forges membership gossip to three node processes: it marks a member `Left`, moves it,
//! claims a version nobody can refute, invents a hundred members, and claims a higher version
//! of the receiver itself; it passes on a revocation list of its own making that revokes a member.
//! Every forged entry (and the list) is refused and counted in `/metrics`, the views keep the
//! three genuine members up with their genuine entries, and every acknowledged point stays
//! readable through every node.
//!
//! It asks for blocks in bulk (`ReadBlocks`, as repair does) and for the list of every block a
//! node holds (`ListBlocks`): placement gives it none of them, so the first is refused and the
//! second lists nothing, both counted in `/metrics`. A device of another fleet's CA fails the
//! handshake, counted as a failed authentication.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use timeshard_node::attest::Attest;
use timeshard_node::pki::{self, Role};
use timeshard_proto::membership::{DigestItem, GossipEntry, Member, MemberStatus, RevocationNews, SignedRevocations};
use timeshard_proto::time::{MAX_TIMESTAMP, MIN_TIMESTAMP};
use timeshard_proto::wire::{Request, Response};
use timeshard_proto::{Id, Point, TimeRange};
use timeshard_sdk::tls::Identity;
use timeshard_testkit::cluster::{ClusterOptions, HTTP_TOKEN, LocalCluster};
use timeshard_testkit::datasets;
use timeshard_testkit::http_client::HttpClient;

use crate::NODE;

const NODES: usize = 3;
const FAKE_MEMBERS: usize = 100;

/// Sends one request as the rogue and returns the answer.
async fn call(rogue: &Identity, addr: std::net::SocketAddr, req: Request) -> Result<Response> {
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse()?)?;
    endpoint.set_default_client_config(timeshard_sdk::tls::client_config(rogue)?);
    let conn = endpoint.connect(addr, timeshard_sdk::tls::NODE_NAME)?.await?;
    let resp = timeshard_sdk::transport::call(&conn, &req, 16 << 20, Duration::from_secs(10)).await?;
    conn.close(0u32.into(), b"done");
    Ok(resp)
}

/// Sends one gossip message as the rogue and returns the entries of the answer.
async fn gossip(rogue: &Identity, addr: std::net::SocketAddr, req: Request) -> Result<Vec<GossipEntry>> {
    match call(rogue, addr, req).await? {
        Response::Gossip { entries, .. } => Ok(entries),
        other => anyhow::bail!("unexpected answer to gossip: {other:?}"),
    }
}

/// Every entry node `addr` holds, as it hands them to a peer that knows none.
async fn entries_of(rogue: &Identity, addr: std::net::SocketAddr) -> Result<Vec<GossipEntry>> {
    let digest = vec![DigestItem { id: Id::sha1(b"nobody"), incarnation: 0, heartbeat: 0 }];
    gossip(rogue, addr, Request::Gossip { digest, entries: Vec::new(), revocations: Default::default() }).await
}

fn refused(metrics: &str) -> u64 {
    counted(metrics, "timeshard_gossip_entries_refused_total{")
}

fn counted(metrics: &str, prefix: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_gossip_from_a_rogue_device_is_refused_and_placement_stays() -> Result<()> {
    let (options, _dir) = ClusterOptions::for_tests(NODES, NODE);
    let cluster = LocalCluster::start_converged(options).await?;
    let rogue = Identity::load(&pki::issue(&cluster.pki_dir(), "rogue", Role::Node)?)?;
    let attest = Attest::new(&rogue, Duration::from_secs(300))?;

    // Acknowledged points, historical and live.
    let client = cluster.client(0).await?;
    let mut acked: Vec<(timeshard_proto::SeriesKey, Vec<Point>)> = Vec::new();
    for bus in 0..4 {
        let key = datasets::pmu_series(bus);
        let mut points: Vec<Point> = datasets::pmu_points(bus, 0, 120).collect();
        let now = timeshard_clock::now_ns();
        points.extend((0..60).map(|i| Point::new(now - 60_000_000_000 + i * 1_000_000_000, f64::from(bus))));
        client.write(&key, &points).await.with_context(|| format!("writing bus {bus}"))?;
        acked.push((key, points));
    }

    let before = entries_of(&rogue, cluster.addr(0)).await?;
    ensure!(before.len() == NODES, "node 0 holds {} entries", before.len());
    let victim = before.iter().find(|e| e.member.id == cluster.id(1)).context("node 1's entry")?.clone();
    let own_proof = |m: &Member| attest.sign(m);

    let mut forged: Vec<GossipEntry> = Vec::new();
    let mut push = |member: Member, proof| forged.push(GossipEntry { member, age_ms: 0, proof, seen_at: None });
    // Node 1 marked Left, moved, and at a version out of reach; with node 1's genuine proof of
    // its older entry, and with the rogue's own signature.
    let mut left = victim.member.clone();
    left.status = MemberStatus::Left;
    left.heartbeat += 1_000;
    let mut moved = victim.member.clone();
    moved.location = Some((48.85, 2.35));
    moved.heartbeat += 1_000;
    let mut saturated = victim.member.clone();
    (saturated.incarnation, saturated.heartbeat) = (u64::MAX, u64::MAX);
    for m in [left, moved, saturated] {
        push(m.clone(), victim.proof.clone());
        push(m.clone(), own_proof(&m));
    }
    // A hundred invented members next to the blocks the rogue wants.
    for i in 0..FAKE_MEMBERS {
        let fake = Member::new(Id::sha1(format!("fake-{i}").as_bytes()), "127.0.0.1:9".parse()?, 1);
        push(fake.clone(), own_proof(&fake));
    }
    // The rogue's own, genuinely signed entry from far in the future.
    let mut future = Member::new(Identity::id(&rogue)?, "127.0.0.1:9".parse()?, u64::MAX - 1);
    future.heartbeat = 1;
    push(future.clone(), own_proof(&future));
    let sent = forged.len() as u64;
    // A revocation list that revokes node 1, signed with the rogue's key, not the fleet CA's.
    let body = serde_json::to_vec(&serde_json::json!({
        "generation": u64::MAX / 2, "issued_at_ms": 0, "max_age_ms": i64::MAX, "revoked": [cluster.id(1).to_hex()],
    }))?;
    let key = rcgen::KeyPair::from_pem(&std::fs::read_to_string(cluster.pki_dir().join("rogue.key"))?)?;
    let signature = rcgen::SigningKey::sign(&key, &body)?;
    let list = SignedRevocations { generation: u64::MAX / 2, body, scheme: 0x0403, signature };
    let forged_revocations = RevocationNews { held: u64::MAX / 2, list: Some(list) };

    for i in [0, 2] {
        gossip(
            &rogue,
            cluster.addr(i),
            Request::Gossip { digest: Vec::new(), entries: forged.clone(), revocations: forged_revocations.clone() },
        )
        .await?;
        // A bare claim that the receiver itself runs at the highest version.
        let me = cluster.id(i);
        let claim = vec![DigestItem { id: me, incarnation: u64::MAX, heartbeat: u64::MAX }];
        gossip(
            &rogue,
            cluster.addr(i),
            Request::Gossip { digest: claim, entries: Vec::new(), revocations: Default::default() },
        )
        .await?;
    }

    // A few gossip rounds later, nothing moved.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for i in 0..NODES {
        let st = cluster.status(i).await?;
        ensure!(
            (st.members_up, st.members_down, st.members_gone) == (NODES as u32, 0, 0),
            "node {i} sees up/down/gone {}/{}/{}",
            st.members_up,
            st.members_down,
            st.members_gone
        );
        let entries = entries_of(&rogue, cluster.addr(i)).await?;
        let mut ids: Vec<Id> = entries.iter().map(|e| e.member.id).collect();
        ids.sort();
        let mut genuine: Vec<Id> = (0..NODES).map(|j| cluster.id(j)).collect();
        genuine.sort();
        ensure!(ids == genuine, "node {i} holds {} entries, not the {NODES} members", ids.len());
        for e in &entries {
            ensure!(e.member.status == MemberStatus::Normal, "node {i}: {:?}", e.member);
            ensure!(e.member.location.is_none(), "node {i}: a location appeared: {:?}", e.member);
            ensure!(e.member.incarnation < u64::MAX / 2, "node {i}: an incarnation out of reach: {:?}", e.member);
        }
    }
    for i in [0, 2] {
        let mut http = HttpClient::connect(cluster.http_addr(i).context("HTTP is on")?, Some(HTTP_TOKEN)).await?;
        let text = http.get("/metrics").await?.text();
        let n = refused(&text);
        ensure!(n >= sent, "node {i} counted {n} refused entries of the {sent} forged");
        let lists = counted(&text, "timeshard_revocations_refused_total");
        ensure!(lists == 1, "node {i} counted {lists} refused revocation lists");
    }

    // Every acknowledged point reads back, point by point, through every node.
    for i in 0..NODES {
        let reader = cluster.client(i).await?;
        for (key, points) in &acked {
            let got = reader.read(key, TimeRange::new(MIN_TIMESTAMP, MAX_TIMESTAMP)?).await?;
            for p in points {
                ensure!(got.contains(p), "node {i}: {key} lost {p:?}");
            }
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rogue_device_reads_and_lists_no_block_in_bulk() -> Result<()> {
    let (options, _dir) = ClusterOptions::for_tests(NODES, NODE);
    let cluster = LocalCluster::start_converged(options).await?;
    let rogue = Identity::load(&pki::issue(&cluster.pki_dir(), "rogue", Role::Node)?)?;
    let client = cluster.client(0).await?;
    let key = datasets::pmu_series(0);
    let points: Vec<Point> = datasets::pmu_points(0, 0, 120).collect();
    client.write(&key, &points).await?;
    let quantum = timeshard_proto::Classes::default().of(&key).quantum.quantum_of(points[0].ts);

    for i in 0..NODES {
        let read = Request::ReadBlocks { blocks: vec![(key.clone(), quantum)], after: None, limit: 1_000 };
        match call(&rogue, cluster.addr(i), read).await {
            Err(e) => {
                let e = format!("{e:#}");
                ensure!(e.contains("Forbidden") && e.contains("placement does not give"), "node {i}: {e}");
            }
            Ok(other) => anyhow::bail!("node {i} served the rogue a bulk read: {other:?}"),
        }
        match call(&rogue, cluster.addr(i), Request::ListBlocks { after: None, limit: 1_000 }).await? {
            Response::BlockList { blocks, .. } => ensure!(blocks.is_empty(), "node {i} listed {} blocks", blocks.len()),
            other => anyhow::bail!("node {i}: unexpected answer to list_blocks: {other:?}"),
        }
        let mut http = HttpClient::connect(cluster.http_addr(i).context("HTTP is on")?, Some(HTTP_TOKEN)).await?;
        let n =
            counted(&http.get("/metrics").await?.text(), "timeshard_peer_requests_refused_total{kind=\"read_blocks\"}");
        ensure!(n >= 1, "node {i} counted {n} refused bulk reads");
    }
    // A device of another fleet does not get past the handshake; the failure is counted.
    let other = tempfile::tempdir()?;
    pki::dev_pki(other.path(), 1)?;
    let stranger = Identity::load(&timeshard_sdk::tls::TlsFiles::in_dir(other.path(), "node-0"))?;
    ensure!(call(&stranger, cluster.addr(0), Request::Ping).await.is_err(), "a stranger's certificate was taken");
    let mut http = HttpClient::connect(cluster.http_addr(0).context("HTTP is on")?, Some(HTTP_TOKEN)).await?;
    let n = counted(&http.get("/metrics").await?.text(), "timeshard_auth_failures_total{door=\"quic\"}");
    ensure!(n >= 1, "node 0 counted {n} failed handshakes");
    // The node itself (its own certificate, as the inspection tools use it) still lists all.
    let mut inspector = timeshard_testkit::inspect::Inspector::new(&cluster).await?;
    for i in 0..NODES {
        ensure!(!inspector.blocks(cluster.addr(i)).await?.is_empty(), "node {i} listed nothing to itself");
    }
    inspector.close().await;
    Ok(())
}
