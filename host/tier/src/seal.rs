//! Signatures of manifests: a node seals each manifest it writes with its TLS key, and every
//! reader checks the seal before reading the manifest's blocks (FORMAT.md, "Seals").
//!
//! The scheme is the one signed membership uses (`timeshard-node`'s `attest`): the seal
//! carries the signer's certificate chain, the TLS signature scheme and the signature; a
//! reader accepts it when the chain leads to the fleet CA, the certificate is a node's, and
//! the node id its public key hashes to is the node whose folder the manifest sits in. The
//! chain is checked as of the time the manifest says it was made, so archived data stays
//! readable after the certificate that sealed it expired.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::server::danger::ClientCertVerifier;
use rustls::sign::SigningKey;
use rustls_pki_types::{CertificateDer, UnixTime};
use serde::{Deserialize, Serialize};
use timeshard_sdk::tls::{self, Identity, PeerIdentity};

/// Most certificates in a seal's chain.
pub const MAX_CHAIN: usize = 4;
/// Most bytes of a seal as stored (its JSON), checked before it is parsed.
pub const MAX_SEAL_BYTES: usize = 64 * 1024;

/// What a manifest's seal says, as stored in its key-value metadata (hex strings in JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seal {
    /// The TLS `SignatureScheme` code of the signature.
    pub scheme: u16,
    /// DER certificates in hex, the signer's own first.
    pub chain: Vec<String>,
    /// The signature in hex.
    pub signature: String,
}

impl Seal {
    /// Parses a stored seal, bounded in size before parsing.
    pub fn parse(json: &str) -> Result<Seal, String> {
        if json.len() > MAX_SEAL_BYTES {
            return Err(format!("the seal is {} bytes, more than {MAX_SEAL_BYTES}", json.len()));
        }
        let seal: Seal = serde_json::from_str(json).map_err(|e| format!("the seal does not parse: {e}"))?;
        if seal.chain.is_empty() || seal.chain.len() > MAX_CHAIN {
            return Err(format!("the seal carries {} certificates (1 to {MAX_CHAIN})", seal.chain.len()));
        }
        Ok(seal)
    }
}

/// The node id a certificate belongs to, in hex (the name its archive folder carries), if it
/// is a node's certificate.
fn node_of(cert: &CertificateDer<'_>) -> Option<String> {
    PeerIdentity::of_certificate(cert).filter(|p| p.is_node).map(|p| p.id.to_hex())
}

struct Own {
    node: String,
    chain: Vec<CertificateDer<'static>>,
    signer: Arc<dyn SigningKey>,
    verifier: Arc<dyn ClientCertVerifier>,
}

/// A node's keys for the archive: its own (to seal) and the fleet CA (to check others').
pub struct Keys {
    own: RwLock<Own>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys").field("node", &self.node()).finish_non_exhaustive()
    }
}

/// The identity cannot seal or check manifests.
#[derive(Debug, thiserror::Error)]
#[error("the node's certificate cannot seal archive manifests: {0}; check [tls] files (`timeshard pki issue`)")]
pub struct KeyError(String);

fn own_of(identity: &Identity) -> Result<Own, KeyError> {
    let tls::Signing { signer, verifier } = tls::Signing::of(identity).map_err(|e| KeyError(e.to_string()))?;
    let node =
        identity.chain.first().and_then(node_of).ok_or_else(|| KeyError("it is not a node certificate".into()))?;
    Ok(Own { node, chain: identity.chain.clone(), signer, verifier })
}

impl Keys {
    /// The keys of `identity` (a node certificate of the fleet).
    pub fn of(identity: &Identity) -> Result<Keys, KeyError> {
        Ok(Keys { own: RwLock::new(own_of(identity)?) })
    }

    /// Seals with a renewed certificate from now on (it must be the same node's).
    pub fn set_identity(&self, identity: &Identity) -> Result<(), KeyError> {
        let own = own_of(identity)?;
        let mut slot = self.own.write().unwrap_or_else(|e| e.into_inner());
        if own.node != slot.node {
            return Err(KeyError(format!("it is node {}'s, not {}'s", own.node, slot.node)));
        }
        *slot = own;
        Ok(())
    }

    /// The node these keys seal for: its id in hex, the name of its archive folder.
    pub fn node(&self) -> String {
        self.own.read().unwrap_or_else(|e| e.into_inner()).node.clone()
    }

    /// Seals `message`.
    pub fn seal(&self, message: &[u8]) -> Result<Seal, KeyError> {
        let own = self.own.read().unwrap_or_else(|e| e.into_inner());
        let (scheme, signature) = tls::sign(&*own.signer, message).map_err(|e| KeyError(e.to_string()))?;
        Ok(Seal { scheme, chain: own.chain.iter().map(|c| hex(c.as_ref())).collect(), signature: hex(&signature) })
    }

    /// Checks that `seal` over `message` was made by node `node` with a certificate of the
    /// fleet valid at `at_ns` (ns since the epoch); the reason when not.
    pub fn check(&self, message: &[u8], seal: &Seal, node: &str, at_ns: i64) -> Result<(), String> {
        let chain: Vec<CertificateDer<'static>> = seal
            .chain
            .iter()
            .map(|h| unhex(h).map(CertificateDer::from).ok_or("a certificate of the seal is not hex"))
            .collect::<Result<_, _>>()?;
        let first = chain.first().ok_or("the seal carries no certificate")?;
        let signer = node_of(first).ok_or("the sealing certificate is not a node's")?;
        if signer != node {
            return Err(format!("it is sealed by node {signer}, not by node {node} whose folder it is in"));
        }
        let at = UnixTime::since_unix_epoch(Duration::from_nanos(u64::try_from(at_ns).unwrap_or(0)));
        let verifier = self.own.read().unwrap_or_else(|e| e.into_inner()).verifier.clone();
        verifier.verify_client_cert(first, &chain[1..], at).map_err(|e| {
            format!("the sealing certificate does not chain to the fleet CA at the manifest's time: {e}")
        })?;
        let signature = unhex(&seal.signature).ok_or("the signature is not hex")?;
        tls::signed_by(first, seal.scheme, message, &signature)
            .then_some(())
            .ok_or_else(|| "the signature does not match the manifest (it was changed after sealing)".to_string())
    }
}

fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    hex::decode(s).ok()
}

/// SHA-256 of `bytes` in hex (what a seal covers of a manifest's row groups).
pub fn sha256(bytes: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    use rustls::RootCertStore;
    use rustls_pki_types::PrivateKeyDer;

    /// A fleet CA that issues node (and client) identities, for tests.
    pub(crate) struct Fleet {
        issuer: Issuer<'static, KeyPair>,
        ca: CertificateDer<'static>,
    }

    impl Fleet {
        pub(crate) fn new() -> Fleet {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            let ca = params.self_signed(&key).unwrap();
            let der = ca.der().clone();
            Fleet { issuer: Issuer::new(params, key), ca: der }
        }

        pub(crate) fn identity(&self, node: bool) -> Identity {
            let key = KeyPair::generate().unwrap();
            let name = if node { tls::NODE_NAME } else { tls::CLIENT_NAME };
            let cert = CertificateParams::new(vec![name.to_string()]).unwrap().signed_by(&key, &self.issuer).unwrap();
            let mut roots = RootCertStore::empty();
            roots.add(self.ca.clone()).unwrap();
            Identity {
                roots: Arc::new(roots),
                cas: vec![self.ca.clone()],
                chain: vec![cert.der().clone()],
                key: PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
            }
        }

        pub(crate) fn keys(&self) -> Keys {
            Keys::of(&self.identity(true)).unwrap()
        }
    }

    fn now() -> i64 {
        timeshard_clock::now_ns()
    }

    #[test]
    fn a_seal_checks_for_its_node_only() {
        let fleet = Fleet::new();
        let (a, b) = (fleet.keys(), fleet.keys());
        let seal = a.seal(b"manifest").unwrap();
        let parsed = Seal::parse(&serde_json::to_string(&seal).unwrap()).unwrap();
        assert_eq!(b.check(b"manifest", &parsed, &a.node(), now()), Ok(()));
        // Changed bytes, another node's folder, a time before the certificate.
        assert!(b.check(b"manifesT", &seal, &a.node(), now()).unwrap_err().contains("changed after sealing"));
        assert!(b.check(b"manifest", &seal, &b.node(), now()).unwrap_err().contains("not by node"));
        assert!(b.check(b"manifest", &seal, &a.node(), 1_000_000_000).unwrap_err().contains("fleet CA"));
    }

    #[test]
    fn strangers_and_clients_cannot_seal() {
        let (fleet, other) = (Fleet::new(), Fleet::new());
        let reader = fleet.keys();
        let stranger = other.keys();
        let seal = stranger.seal(b"m").unwrap();
        assert!(reader.check(b"m", &seal, &stranger.node(), now()).unwrap_err().contains("fleet CA"));
        assert!(Keys::of(&fleet.identity(false)).is_err(), "a client certificate is no node's");
        let mut junk = seal.clone();
        junk.chain = vec!["zz".into()];
        assert!(reader.check(b"m", &junk, &stranger.node(), now()).is_err());
        assert!(Seal::parse(&"x".repeat(MAX_SEAL_BYTES + 1)).is_err());
        let empty = Seal { chain: vec![], ..seal };
        assert!(Seal::parse(&serde_json::to_string(&empty).unwrap()).is_err());
    }

    #[test]
    fn hex_round_trips() {
        assert_eq!(unhex(&hex(&[0, 1, 0xab, 0xff])), Some(vec![0, 1, 0xab, 0xff]));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
    }
}
