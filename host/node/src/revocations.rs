//! The fleet's revocation list as this node holds it. The control plane signs the list with the
//! fleet CA's key and puts it in every node's desired state; nodes pass it on with their
//! gossip, so a site cut off from the control plane learns a revocation from any neighbour
//! that has it. A list is taken only when the fleet CA's key signed it and it is newer (by
//! fleet generation) than the one held, so no node can forge, shorten or roll back the list.
//!
//! A list older than its `max_age_ms` still applies (a revocation never expires early); it is
//! reported as stale in the node's status and `/metrics`.
//!
//! The newest list taken is kept in the data directory ([`FILE`]) and offered again at start,
//! so a node that learned a revocation by gossip still refuses the revoked node after a
//! restart, before any peer or the control plane tells it again. The file is checked like any
//! list: one that is not the fleet CA's is refused.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use timeshard_control_api::state::RevocationList;
use timeshard_proto::Id;
use timeshard_proto::membership::{RevocationNews, SignedRevocations};
use tokio::sync::watch;

use crate::attest::Attest;

/// Most ids a list may name.
const MAX_IDS: usize = 1 << 16;
/// Where the newest list taken is kept, in the node's data directory.
pub const FILE: &str = "revocations.json";

/// Why a list was not taken.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RevocationError {
    #[error("the revocation list is not signed by the fleet CA")]
    NotSigned,
    #[error("the revocation list is not one: {0}")]
    Malformed(String),
}

#[derive(Debug)]
struct Held {
    signed: SignedRevocations,
    list: RevocationList,
    ids: Arc<HashSet<Id>>,
}

/// The newest signed revocation list this node has seen.
#[derive(Debug)]
pub struct Revocations {
    attest: Arc<Attest>,
    held: Mutex<Option<Held>>,
    changes: watch::Sender<Arc<HashSet<Id>>>,
    refused: AtomicU64,
}

impl Revocations {
    /// Holds no list yet; lists are checked with `attest`'s fleet CA.
    pub fn new(attest: Arc<Attest>) -> Revocations {
        Revocations {
            attest,
            held: Mutex::new(None),
            changes: watch::Sender::new(Arc::default()),
            refused: AtomicU64::new(0),
        }
    }

    fn held_lock(&self) -> std::sync::MutexGuard<'_, Option<Held>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The generation of the list held (0: none).
    pub fn generation(&self) -> u64 {
        self.held_lock().as_ref().map_or(0, |h| h.signed.generation)
    }

    /// The ids the held list revokes, if one is held.
    pub fn ids(&self) -> Option<Arc<HashSet<Id>>> {
        self.held_lock().as_ref().map(|h| h.ids.clone())
    }

    /// When the held list was signed and how long it counts as current (ms since the epoch, ms).
    pub fn issued(&self) -> Option<(i64, i64)> {
        self.held_lock().as_ref().map(|h| (h.list.issued_at_ms, h.list.max_age_ms))
    }

    /// Lists refused so far (not signed by the fleet CA, or malformed).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Fires with the revoked ids whenever a newer list is taken.
    pub fn subscribe(&self) -> watch::Receiver<Arc<HashSet<Id>>> {
        self.changes.subscribe()
    }

    /// What to tell a peer that holds generation `theirs` (`None`: not known): what this node
    /// holds, and the list when the peer is behind.
    pub fn news_for(&self, theirs: Option<u64>) -> RevocationNews {
        let held = self.held_lock();
        let generation = held.as_ref().map_or(0, |h| h.signed.generation);
        let behind = theirs.is_some_and(|t| t < generation);
        RevocationNews { held: generation, list: held.as_ref().filter(|_| behind).map(|h| h.signed.clone()) }
    }

    /// Takes `signed` if the fleet CA signed it and it is newer than the list held; returns
    /// whether it was taken. A refused list is counted.
    pub fn offer(&self, signed: SignedRevocations) -> Result<bool, RevocationError> {
        if signed.generation <= self.generation() {
            return Ok(false);
        }
        let checked = self.check(&signed);
        let (list, ids) = match checked {
            Ok(ok) => ok,
            Err(e) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
        };
        let ids = Arc::new(ids);
        {
            let mut held = self.held_lock();
            if held.as_ref().is_some_and(|h| h.signed.generation >= signed.generation) {
                return Ok(false);
            }
            *held = Some(Held { signed, list, ids: ids.clone() });
        }
        self.changes.send_replace(ids);
        Ok(true)
    }

    /// The signed list held, as taken.
    pub fn held(&self) -> Option<SignedRevocations> {
        self.held_lock().as_ref().map(|h| h.signed.clone())
    }

    /// Keeps the list held in `data_dir` ([`FILE`]), replacing the file whole.
    pub fn save(&self, data_dir: &std::path::Path) -> Result<(), String> {
        let Some(signed) = self.held() else { return Ok(()) };
        let bytes = serde_json::to_vec(&signed).map_err(|e| e.to_string())?;
        timeshard_control_api::files::write_atomic(&data_dir.join(FILE), &bytes, false).map_err(|e| e.to_string())
    }

    /// Offers the list kept in `data_dir`, if there is one; returns whether it was taken. A
    /// file that is not a list the fleet CA signed is an error and changes nothing.
    pub fn load(&self, data_dir: &std::path::Path) -> Result<bool, RevocationError> {
        let path = data_dir.join(FILE);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(RevocationError::Malformed(format!("{}: {e}", path.display()))),
        };
        // JSON writes the body's bytes as numbers: at most 4 characters each, and the rest.
        if bytes.len() > 5 * timeshard_proto::membership::MAX_REVOCATIONS_BYTES {
            return Err(RevocationError::Malformed(format!("{} is larger than any list", path.display())));
        }
        let signed: SignedRevocations = serde_json::from_slice(&bytes)
            .map_err(|e| RevocationError::Malformed(format!("{}: {e}", path.display())))?;
        self.offer(signed)
    }

    fn check(&self, signed: &SignedRevocations) -> Result<(RevocationList, HashSet<Id>), RevocationError> {
        if !signed.is_bounded() {
            return Err(RevocationError::Malformed("larger than the wire allows".into()));
        }
        if !self.attest.signed_by_the_ca(&signed.body, signed.scheme, &signed.signature) {
            return Err(RevocationError::NotSigned);
        }
        let list: RevocationList =
            serde_json::from_slice(&signed.body).map_err(|e| RevocationError::Malformed(e.to_string()))?;
        if list.generation != signed.generation {
            return Err(RevocationError::Malformed(format!(
                "it says generation {} but travels as {}",
                list.generation, signed.generation
            )));
        }
        if list.revoked.len() > MAX_IDS {
            return Err(RevocationError::Malformed(format!("{} ids, over {MAX_IDS}", list.revoked.len())));
        }
        let ids = list
            .revoked
            .iter()
            .map(|s| s.parse::<Id>().map_err(|_| RevocationError::Malformed(format!("node id {s:?}"))))
            .collect::<Result<HashSet<Id>, _>>()?;
        Ok((list, ids))
    }
}

/// The wire form of the control plane's signed list.
pub fn from_desired(doc: &timeshard_control_api::state::SignedRevocationList) -> Option<SignedRevocations> {
    Some(SignedRevocations {
        generation: doc.generation,
        body: doc.body.as_bytes().to_vec(),
        scheme: doc.scheme,
        signature: timeshard_control_api::token::unhex(&doc.signature)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attest::tests::{fleet, identity};
    use rcgen::{KeyPair, SigningKey as _};
    use std::path::Path;
    use std::time::Duration;

    fn sign(key_pem: &Path, generation: u64, body_generation: u64, revoked: &[Id]) -> SignedRevocations {
        let key = KeyPair::from_pem(&std::fs::read_to_string(key_pem).unwrap()).unwrap();
        let list = RevocationList {
            generation: body_generation,
            issued_at_ms: 1,
            max_age_ms: 1_000,
            revoked: revoked.iter().map(Id::to_hex).collect(),
        };
        let body = serde_json::to_vec(&list).unwrap();
        let signature = key.sign(&body).unwrap();
        SignedRevocations { generation, body, scheme: 0x0403, signature }
    }

    fn revocations(dir: &Path) -> Revocations {
        let attest = Attest::new(&identity(dir, "node-0"), Duration::from_secs(60)).unwrap();
        Revocations::new(Arc::new(attest))
    }

    #[test]
    fn a_list_the_fleet_ca_signed_is_taken_once_and_passed_on_to_peers_behind() {
        let dir = fleet(1);
        let r = revocations(dir.path());
        let mut changes = r.subscribe();
        let stolen = Id::sha1(b"stolen");
        assert_eq!(r.offer(sign(&dir.path().join("ca.key"), 5, 5, &[stolen])), Ok(true));
        assert!(changes.has_changed().unwrap());
        assert!(changes.borrow_and_update().contains(&stolen));
        assert_eq!(r.generation(), 5);
        assert!(r.news_for(Some(4)).list.is_some(), "a peer behind gets the list");
        assert!(r.news_for(Some(5)).list.is_none() && r.news_for(None).list.is_none());
        assert_eq!(r.news_for(None).held, 5);
        // The same or an older generation changes nothing.
        assert_eq!(r.offer(sign(&dir.path().join("ca.key"), 5, 5, &[])), Ok(false));
        assert_eq!(r.offer(sign(&dir.path().join("ca.key"), 3, 3, &[])), Ok(false));
        assert!(r.ids().unwrap().contains(&stolen));
    }

    /// A list learned by gossip used to live in memory only: a node restarted while cut off
    /// from its peers and the control plane accepted the revoked node again.
    #[test]
    fn a_list_taken_is_kept_and_offered_again_after_a_restart() {
        let dir = fleet(1);
        let data = tempfile::tempdir().unwrap();
        let stolen = Id::sha1(b"stolen");
        let before = revocations(dir.path());
        assert_eq!(before.load(data.path()), Ok(false), "nothing kept yet");
        assert_eq!(before.offer(sign(&dir.path().join("ca.key"), 7, 7, &[stolen])), Ok(true));
        before.save(data.path()).unwrap();
        let after = revocations(dir.path());
        assert_eq!(after.load(data.path()), Ok(true));
        assert_eq!(after.generation(), 7);
        assert!(after.ids().unwrap().contains(&stolen));
        // A file that is not the fleet CA's list is refused and changes nothing.
        std::fs::write(
            data.path().join(FILE),
            serde_json::to_vec(&sign(&dir.path().join("node-0.key"), 9, 9, &[])).unwrap(),
        )
        .unwrap();
        let fresh = revocations(dir.path());
        assert_eq!(fresh.load(data.path()), Err(RevocationError::NotSigned));
        assert_eq!(fresh.generation(), 0);
        std::fs::write(data.path().join(FILE), b"{not json").unwrap();
        assert!(matches!(fresh.load(data.path()), Err(RevocationError::Malformed(_))));
    }

    #[test]
    fn lists_not_signed_by_the_fleet_ca_or_not_what_they_claim_are_refused() {
        let dir = fleet(1);
        let r = revocations(dir.path());
        // A node's key, and another fleet's CA.
        assert_eq!(r.offer(sign(&dir.path().join("node-0.key"), 9, 9, &[])), Err(RevocationError::NotSigned));
        let other = fleet(1);
        assert_eq!(r.offer(sign(&other.path().join("ca.key"), 9, 9, &[])), Err(RevocationError::NotSigned));
        // Signed, but travelling under another generation than it says.
        assert!(matches!(r.offer(sign(&dir.path().join("ca.key"), 9, 2, &[])), Err(RevocationError::Malformed(_))));
        // A tampered body.
        let mut tampered = sign(&dir.path().join("ca.key"), 9, 9, &[Id::sha1(b"x")]);
        tampered.body =
            serde_json::to_vec(&RevocationList { generation: 9, issued_at_ms: 1, max_age_ms: 1_000, revoked: vec![] })
                .unwrap();
        assert_eq!(r.offer(tampered), Err(RevocationError::NotSigned));
        assert_eq!((r.refused(), r.generation()), (4, 0));
    }
}
