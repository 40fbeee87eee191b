//! Signed membership entries. A node signs its own entry with its TLS key, and takes an entry
//! from gossip only when the entry's certificate chains to the fleet CA, names a node (not a
//! client), hashes to the entry's id, and its key signed this very entry. So a device can only
//! ever speak for itself: it cannot mark another node `Left`, move it, invent members, or
//! raise another node's version. Incarnations are bounded by this node's clock plus
//! `max_clock_skew`, so nobody can push a version out of reach of its owner's refutation.
//!
//! The signature covers the entry and the anchor of a hash chain; each later heartbeat is
//! proven by the next token of that chain ([`timeshard_proto::beat_chain`]). A checker
//! remembers, per member, the last body and token it verified, so the steady state costs a
//! hash or two per entry that advanced, and one signature check per change of an entry
//! (or every [`beat_chain::LEN`] heartbeats). Verified certificate chains are remembered too
//! (by the hash of the chain, until they expire).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rand::Rng as _;
use rustls::server::danger::ClientCertVerifier;
use rustls::sign::SigningKey;
use rustls_pki_types::{CertificateDer, UnixTime};
use timeshard_proto::Id;
use timeshard_proto::beat_chain::{self, BeatChain, Token};
use timeshard_proto::membership::{GossipEntry, Member, Proof};
use timeshard_sdk::tls::{self, Identity, PeerIdentity, TlsError};

/// Verified chains (and members' verified entries) remembered before the memory is cleared.
const VERIFIED_MAX: usize = 32_768;

/// This node's entry as it last signed it.
struct Own {
    /// The entry with the heartbeat its chain starts at: what the signature covers.
    body: Member,
    proof: Proof,
    chain: BeatChain,
}

/// The last entry of a member this node verified.
#[derive(Clone, Copy)]
struct Known {
    /// SHA-1 of what was verified but the token: the signed bytes, the signature and the
    /// certificate that made it.
    body: Id,
    beat: u64,
    token: Token,
    /// When the certificate expires.
    until: UnixTime,
}

/// Why a gossip entry was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// It carries no proof, or one over the size limits.
    Unsigned,
    /// Its certificate does not chain to the fleet CA, or has expired.
    Certificate,
    /// The certificate is a client's, or its key does not hash to the entry's id.
    NotThatNode,
    /// The signature does not verify.
    Signature,
    /// Its incarnation is later than this node's clock plus the allowed skew.
    FromTheFuture,
}

impl Refusal {
    pub const ALL: [Refusal; 5] =
        [Refusal::Unsigned, Refusal::Certificate, Refusal::NotThatNode, Refusal::Signature, Refusal::FromTheFuture];

    /// Its `reason` label in `/metrics`.
    pub fn labels(self) -> [(&'static str, &'static str); 1] {
        [("reason", self.label())]
    }

    /// The label `/metrics` counts it under.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Unsigned => "unsigned",
            Refusal::Certificate => "certificate",
            Refusal::NotThatNode => "not_that_node",
            Refusal::Signature => "signature",
            Refusal::FromTheFuture => "from_the_future",
        }
    }
}

struct Keys {
    chain: Vec<CertificateDer<'static>>,
    /// The fleet CA certificates, whose keys sign the revocation list.
    cas: Vec<CertificateDer<'static>>,
    signer: Arc<dyn SigningKey>,
    verifier: Arc<dyn ClientCertVerifier>,
}

impl Keys {
    fn of(identity: &Identity) -> Result<Keys, TlsError> {
        let tls::Signing { signer, verifier } = tls::Signing::of(identity)
            .map_err(|e| TlsError::Config(format!("the node's key cannot sign membership entries: {e}")))?;
        Ok(Keys { chain: identity.chain.clone(), cas: identity.cas.clone(), signer, verifier })
    }
}

/// Signs this node's entry and checks everyone else's.
pub struct Attest {
    keys: RwLock<Keys>,
    max_skew: Duration,
    /// SHA-1 of a verified chain's first certificate → when it expires.
    verified: Mutex<HashMap<Id, UnixTime>>,
    /// This node's entry as last signed: one signature per change of the entry.
    own: Mutex<Option<Own>>,
    /// Member id → its entry as last verified.
    known: Mutex<HashMap<Id, Known>>,
    refused: [AtomicU64; Refusal::ALL.len()],
}

impl std::fmt::Debug for Attest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attest").field("max_skew", &self.max_skew).finish_non_exhaustive()
    }
}

impl Attest {
    /// Signs with `identity`'s key and trusts its CA; incarnations may run `max_skew` ahead of
    /// this node's clock.
    pub fn new(identity: &Identity, max_skew: Duration) -> Result<Attest, TlsError> {
        Ok(Attest {
            keys: RwLock::new(Keys::of(identity)?),
            max_skew,
            verified: Mutex::new(HashMap::new()),
            own: Mutex::new(None),
            known: Mutex::new(HashMap::new()),
            refused: Default::default(),
        })
    }

    /// Signs with a renewed certificate from now on.
    pub fn set_identity(&self, identity: &Identity) -> Result<(), TlsError> {
        let keys = Keys::of(identity)?;
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) = keys;
        *self.own.lock().unwrap_or_else(|e| e.into_inner()) = None;
        Ok(())
    }

    /// The proof of this node's `member` entry: a new signature when the entry changed (or its
    /// chain ran out), else the next token of the chain signed last.
    pub fn sign(&self, member: &Member) -> Option<Proof> {
        let mut own = self.own.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(o) = own.as_ref()
            && o.body == (Member { heartbeat: o.chain.first(), ..member.clone() })
            && let Some(beats) = o.chain.prove(member.heartbeat)
        {
            return Some(Proof { beats, ..o.proof.clone() });
        }
        let chain = BeatChain::new(member.heartbeat, timeshard_clock::rng().random());
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
        let signed = member.signed_bytes(chain.first(), &chain.anchor());
        let (scheme, signature) = tls::sign(&*keys.signer, &signed).ok()?;
        let beats = chain.prove(member.heartbeat)?;
        let proof = Proof { chain: keys.chain.iter().map(|c| c.as_ref().to_vec()).collect(), scheme, signature, beats };
        let body = Member { heartbeat: chain.first(), ..member.clone() };
        *own = Some(Own { body, proof: proof.clone(), chain });
        Some(proof)
    }

    /// Checks `entry` as of `now_ns` (nanoseconds since the Unix epoch), counting a refusal.
    pub fn check(&self, entry: &GossipEntry, now_ns: u64) -> Result<(), Refusal> {
        let verdict = self.verdict(entry, now_ns);
        if let Err(r) = verdict {
            self.refused[r as usize].fetch_add(1, Ordering::Relaxed);
        }
        verdict
    }

    fn verdict(&self, entry: &GossipEntry, now_ns: u64) -> Result<(), Refusal> {
        let member = &entry.member;
        let Some(proof) = entry.proof.as_ref().filter(|p| p.is_bounded()) else {
            return Err(Refusal::Unsigned);
        };
        let skew_ns = u64::try_from(self.max_skew.as_nanos()).unwrap_or(u64::MAX);
        if member.incarnation > now_ns.saturating_add(skew_ns) {
            return Err(Refusal::FromTheFuture);
        }
        let beats = &proof.beats;
        if member.heartbeat.checked_sub(beats.first).is_none_or(|k| k > beat_chain::LEN) {
            return Err(Refusal::Signature);
        }
        let signed = member.signed_bytes(beats.first, &beats.anchor);
        let body = {
            let mut all = Vec::with_capacity(signed.len() + proof.signature.len() + proof.chain[0].len() + 2);
            all.extend_from_slice(&signed);
            all.extend_from_slice(&proof.scheme.to_be_bytes());
            all.extend_from_slice(&proof.signature);
            all.extend_from_slice(&proof.chain[0]);
            Id::sha1(&all)
        };
        let now = UnixTime::since_unix_epoch(Duration::from_nanos(now_ns));
        // A later beat of an entry verified before: its token hashes to the token verified.
        let known = self.known.lock().unwrap_or_else(|e| e.into_inner()).get(&member.id).copied();
        if let Some(k) = known.filter(|k| k.body == body && k.until > now && member.heartbeat >= k.beat) {
            if !beat_chain::reaches(&beats.token, member.heartbeat - k.beat, &k.token) {
                return Err(Refusal::Signature);
            }
            self.remember(member.id, Known { beat: member.heartbeat, token: beats.token, ..k });
            return Ok(());
        }
        let chain: Vec<CertificateDer<'_>> = proof.chain.iter().map(|c| CertificateDer::from(c.as_slice())).collect();
        let peer = PeerIdentity::of_certificate(&chain[0]).ok_or(Refusal::Certificate)?;
        if !peer.is_node || peer.id != member.id {
            return Err(Refusal::NotThatNode);
        }
        let until = self.verify_chain(&chain, now)?;
        if !tls::signed_by(&chain[0], proof.scheme, &signed, &proof.signature)
            || !beat_chain::proves(beats, member.heartbeat)
        {
            return Err(Refusal::Signature);
        }
        self.remember(member.id, Known { body, beat: member.heartbeat, token: beats.token, until });
        Ok(())
    }

    fn remember(&self, id: Id, known: Known) {
        let mut all = self.known.lock().unwrap_or_else(|e| e.into_inner());
        if all.len() >= VERIFIED_MAX && !all.contains_key(&id) {
            all.clear();
        }
        all.insert(id, known);
    }

    /// Whether the key of one of the fleet CA certificates made `signature` (TLS scheme
    /// `scheme`) over `message`: how the control plane's revocation list is checked.
    pub fn signed_by_the_ca(&self, message: &[u8], scheme: u16, signature: &[u8]) -> bool {
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
        keys.cas.iter().any(|ca| tls::signed_by(ca, scheme, message, signature))
    }

    /// Verifies that `chain` leads to the fleet CA as of `now`, remembering the answer until
    /// the certificate expires (which it returns).
    fn verify_chain(&self, chain: &[CertificateDer<'_>], now: UnixTime) -> Result<UnixTime, Refusal> {
        let key = Id::sha1(chain[0].as_ref());
        if let Some(until) = self.verified.lock().unwrap_or_else(|e| e.into_inner()).get(&key).filter(|u| **u > now) {
            return Ok(*until);
        }
        let verifier = self.keys.read().unwrap_or_else(|e| e.into_inner()).verifier.clone();
        verifier.verify_client_cert(&chain[0], &chain[1..], now).map_err(|_| Refusal::Certificate)?;
        let not_after = x509_parser::parse_x509_certificate(chain[0].as_ref())
            .map(|(_, c)| c.validity().not_after.timestamp())
            .ok()
            .and_then(|t| u64::try_from(t).ok())
            .map_or(now, |t| UnixTime::since_unix_epoch(Duration::from_secs(t)));
        let mut verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
        if verified.len() >= VERIFIED_MAX {
            verified.clear();
        }
        verified.insert(key, not_after);
        Ok(not_after)
    }

    /// Entries refused so far, by reason.
    pub fn refused(&self) -> Vec<(Refusal, u64)> {
        Refusal::ALL.iter().map(|&r| (r, self.refused[r as usize].load(Ordering::Relaxed))).collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::path::Path;
    use timeshard_sdk::tls::TlsFiles;

    /// A development PKI with `nodes` node certificates and a client certificate.
    pub(crate) fn fleet(nodes: usize) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        crate::pki::dev_pki(dir.path(), nodes).unwrap();
        dir
    }

    pub(crate) fn identity(dir: &Path, name: &str) -> Identity {
        Identity::load(&TlsFiles::in_dir(dir, name)).unwrap()
    }

    fn now_ns() -> u64 {
        u64::try_from(timeshard_clock::now_ns()).unwrap()
    }

    fn signed_entry(attest: &Attest, member: Member) -> GossipEntry {
        let proof = attest.sign(&member);
        GossipEntry { member, age_ms: 0, proof, seen_at: None }
    }

    fn member_of(who: &Identity) -> Member {
        Member::new(who.id().unwrap(), "127.0.0.1:7000".parse().unwrap(), now_ns())
    }

    #[test]
    fn a_node_signs_its_entry_and_only_that_entry_verifies() {
        let dir = fleet(2);
        let (a, b) = (identity(dir.path(), "node-0"), identity(dir.path(), "node-1"));
        let skew = Duration::from_secs(60);
        let (signer, checker) = (Attest::new(&a, skew).unwrap(), Attest::new(&b, skew).unwrap());
        let entry = signed_entry(&signer, member_of(&a));
        assert_eq!(checker.check(&entry, now_ns()), Ok(()));
        assert_eq!(checker.check(&entry, now_ns()), Ok(()), "a remembered chain verifies too");
        // Any change to the entry breaks the signature.
        let mut tampered = entry.clone();
        tampered.member.status = timeshard_proto::membership::MemberStatus::Left;
        assert_eq!(checker.check(&tampered, now_ns()), Err(Refusal::Signature));
        // No proof, or one that is too large.
        let unsigned = GossipEntry { proof: None, ..entry.clone() };
        assert_eq!(checker.check(&unsigned, now_ns()), Err(Refusal::Unsigned));
        let mut huge = entry.clone();
        huge.proof.as_mut().unwrap().chain.push(vec![0; 4]);
        huge.proof.as_mut().unwrap().chain.push(vec![0; 4]);
        huge.proof.as_mut().unwrap().chain.push(vec![0; 4]);
        assert_eq!(checker.check(&huge, now_ns()), Err(Refusal::Unsigned));
        // a's key speaking for b.
        let mut for_b = member_of(&b);
        for_b.heartbeat = 3;
        let forged = signed_entry(&signer, for_b);
        assert_eq!(checker.check(&forged, now_ns()), Err(Refusal::NotThatNode));
        let counted: u64 = checker.refused().iter().map(|(_, n)| n).sum();
        assert_eq!(counted, 4);
    }

    #[test]
    fn heartbeats_are_proven_by_the_chain_and_cannot_be_advanced_by_anyone_else() {
        let dir = fleet(2);
        let (a, b) = (identity(dir.path(), "node-0"), identity(dir.path(), "node-1"));
        let skew = Duration::from_secs(60);
        let (signer, checker) = (Attest::new(&a, skew).unwrap(), Attest::new(&b, skew).unwrap());
        let mut member = member_of(&a);
        let first = signed_entry(&signer, member.clone());
        for beat in 1..=20 {
            member.heartbeat = beat;
            let entry = signed_entry(&signer, member.clone());
            let proof = entry.proof.as_ref().unwrap();
            assert_eq!(proof.signature, first.proof.as_ref().unwrap().signature, "one signature for the chain");
            assert_eq!(checker.check(&entry, now_ns()), Ok(()), "beat {beat}");
            // A relay that holds this beat's proof claims the next beat with it.
            let mut forged = entry.clone();
            forged.member.heartbeat += 1;
            assert_eq!(checker.check(&forged, now_ns()), Err(Refusal::Signature), "beat {beat} + 1 forged");
        }
        // A checker that never saw the chain verifies a late beat from the anchor.
        member.heartbeat = 200;
        let late = signed_entry(&signer, member.clone());
        let fresh = Attest::new(&b, skew).unwrap();
        assert_eq!(fresh.check(&late, now_ns()), Ok(()));
        // Past the chain's end the node signs a new one; a forged heartbeat far beyond the
        // chain is refused before any hashing.
        member.heartbeat = beat_chain::LEN + 1;
        let next = signed_entry(&signer, member.clone());
        assert_ne!(next.proof.as_ref().unwrap().signature, first.proof.as_ref().unwrap().signature);
        assert_eq!(checker.check(&next, now_ns()), Ok(()));
        let mut far = next.clone();
        far.member.heartbeat = u64::MAX;
        assert_eq!(checker.check(&far, now_ns()), Err(Refusal::Signature));
        // A changed entry is signed anew, and the old chain's tokens do not carry over to it.
        member.heartbeat += 1;
        member.status = timeshard_proto::membership::MemberStatus::Leaving;
        let leaving = signed_entry(&signer, member.clone());
        assert_eq!(checker.check(&leaving, now_ns()), Ok(()));
        let mut moved = next.clone();
        moved.member.status = timeshard_proto::membership::MemberStatus::Left;
        assert_eq!(checker.check(&moved, now_ns()), Err(Refusal::Signature));
        // A token swapped in from another node's chain, on a body verified before.
        let other = Attest::new(&b, skew).unwrap();
        let mut theirs = member_of(&b);
        theirs.heartbeat = leaving.member.heartbeat + 1;
        let their_token = signed_entry(&other, theirs).proof.unwrap().beats.token;
        let mut swapped = leaving.clone();
        swapped.member.heartbeat += 1;
        swapped.proof.as_mut().unwrap().beats.token = their_token;
        assert_eq!(checker.check(&swapped, now_ns()), Err(Refusal::Signature));
    }

    #[test]
    fn clients_other_fleets_and_the_future_are_refused() {
        let dir = fleet(1);
        let node = identity(dir.path(), "node-0");
        let client = identity(dir.path(), "client");
        let other = fleet(1);
        let stranger = identity(other.path(), "node-0");
        let skew = Duration::from_secs(60);
        let checker = Attest::new(&node, skew).unwrap();
        // A client certificate cannot make a member, even of its own id.
        let by_client = signed_entry(&Attest::new(&client, skew).unwrap(), member_of(&client));
        assert_eq!(checker.check(&by_client, now_ns()), Err(Refusal::NotThatNode));
        // A node certificate of another CA.
        let by_stranger = signed_entry(&Attest::new(&stranger, skew).unwrap(), member_of(&stranger));
        assert_eq!(checker.check(&by_stranger, now_ns()), Err(Refusal::Certificate));
        // A genuine entry whose incarnation is beyond the clock plus the skew.
        let signer = Attest::new(&node, skew).unwrap();
        let mut ahead = member_of(&node);
        ahead.incarnation = now_ns() + 2 * 60_000_000_000;
        assert_eq!(checker.check(&signed_entry(&signer, ahead.clone()), now_ns()), Err(Refusal::FromTheFuture));
        ahead.incarnation = now_ns() + 30_000_000_000;
        assert_eq!(checker.check(&signed_entry(&signer, ahead), now_ns()), Ok(()));
    }
}
