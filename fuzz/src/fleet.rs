//! A small fleet for the `gossip_entry` target: a CA and certificates derived from a fixed seed
//! (the simulator's PKI), so the signed entries of the seed corpus verify in every process that
//! fuzzes or replays them, and mutations reach the signature and incarnation checks.

use std::sync::OnceLock;

use timeshard_node::attest::Attest;
use timeshard_proto::membership::{GossipEntry, Member};
use timeshard_sdk::tls::{Identity, TlsFiles};
use timeshard_sim::pki::Pki;

/// How far incarnations may run ahead of the clock (the node's default).
const SKEW: std::time::Duration = std::time::Duration::from_secs(60);

/// The checking node, and entries' signers: another node, a client, a node of another CA.
pub struct Fleet {
    pub checker: Attest,
    /// The checking node's keys for the archive (`tier_manifest`: it checks seals).
    pub archive: timeshard_tier::seal::Keys,
    /// `node`'s keys for the archive: they seal the `tier_manifest` seed.
    pub sealer: timeshard_tier::seal::Keys,
    pub node: (Attest, Identity),
    pub client: (Attest, Identity),
    pub stranger: (Attest, Identity),
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet").field("checker", &self.checker).finish_non_exhaustive()
    }
}

fn identity(pki: &mut Pki, name: &str, node: bool) -> Identity {
    let files: TlsFiles = pki.issue(name, node).expect("issue a certificate");
    Identity::load(&files).expect("load the certificate just issued")
}

fn signer(who: Identity) -> (Attest, Identity) {
    (Attest::new(&who, SKEW).expect("an attester"), who)
}

/// The fleet, made once per process.
pub fn fleet() -> &'static Fleet {
    static FLEET: OnceLock<Fleet> = OnceLock::new();
    FLEET.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut pki = Pki::new(&dir.path().join("fleet"), 24).expect("the fleet CA");
        let mut other = Pki::new(&dir.path().join("other"), 25).expect("another CA");
        let checker = identity(&mut pki, "node-0", true);
        let node = identity(&mut pki, "node-1", true);
        Fleet {
            checker: Attest::new(&checker, SKEW).expect("an attester"),
            archive: timeshard_tier::seal::Keys::of(&checker).expect("archive keys"),
            sealer: timeshard_tier::seal::Keys::of(&node).expect("archive keys"),
            node: signer(node),
            client: signer(identity(&mut pki, "client", false)),
            stranger: signer(identity(&mut other, "node-0", true)),
            _dir: dir,
        }
    })
}

/// The manifest of the `tier_manifest` target in the folder of the fleet's `node`.
pub fn sealed_file_id() -> timeshard_tier::FileId {
    timeshard_tier::FileId { node: fleet().sealer.node(), ..crate::archive_file_id() }
}

/// `who`'s own entry at incarnation `now_ns`, signed by `who`.
pub fn signed_entry((attest, who): &(Attest, Identity), now_ns: u64) -> GossipEntry {
    let member = Member::new(who.id().expect("an id"), "127.0.0.1:7000".parse().expect("an address"), now_ns);
    GossipEntry { proof: attest.sign(&member), member, age_ms: 0, seen_at: None }
}
