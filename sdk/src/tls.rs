//! Certificates and rustls configuration for mutual TLS over QUIC.
//!
//! Every node and every client holds a certificate from the fleet CA. Node certificates name
//! [`NODE_NAME`]; client certificates name [`CLIENT_NAME`]. A node's id is the SHA-1 of the
//! public key in its certificate ([`PeerIdentity::of_certificate`]), so the CA's signature binds
//! the id.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use timeshard_proto::Id;
use timeshard_proto::wire::ALPN;

pub use crate::cert_grace::{EXPIRED_CERT_GRACE, GraceClientVerifier, GraceServerVerifier};
pub use timeshard_proto::wire::{CLIENT_NAME, NODE_NAME};

/// Loading or using certificates failed.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} from {path}: {reason}; create one with `timeshard pki init` / `timeshard pki issue`")]
    Read { what: &'static str, path: PathBuf, reason: String },
    #[error("{path} holds no {what}")]
    Empty { what: &'static str, path: PathBuf },
    #[error("invalid TLS configuration: {0}")]
    Config(String),
}

/// The three files an identity consists of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The fleet CA certificate (PEM).
    pub ca: PathBuf,
    /// This party's certificate chain (PEM).
    pub cert: PathBuf,
    /// This party's private key (PEM, PKCS#8).
    pub key: PathBuf,
}

impl TlsFiles {
    /// `ca.pem`, `<name>.pem` and `<name>.key` in `dir`, as `timeshard pki` writes them.
    pub fn in_dir(dir: &Path, name: &str) -> TlsFiles {
        TlsFiles { ca: dir.join("ca.pem"), cert: dir.join(format!("{name}.pem")), key: dir.join(format!("{name}.key")) }
    }
}

/// A loaded identity: the CA to trust and our own chain and key.
#[derive(Debug)]
pub struct Identity {
    pub roots: Arc<RootCertStore>,
    /// The CA certificates `roots` was made of (DER), for checking what the CA signed besides
    /// certificates (the fleet's revocation list).
    pub cas: Vec<CertificateDer<'static>>,
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Identity {
            roots: self.roots.clone(),
            cas: self.cas.clone(),
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl Identity {
    /// Loads the files.
    pub fn load(files: &TlsFiles) -> Result<Identity, TlsError> {
        let read_err = |what, path: &Path, e: &dyn std::fmt::Display| TlsError::Read {
            what,
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        let cas = CertificateDer::pem_file_iter(&files.ca)
            .map_err(|e| read_err("the CA certificate", &files.ca, &e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| read_err("the CA certificate", &files.ca, &e))?;
        if cas.is_empty() {
            return Err(TlsError::Empty { what: "CA certificate", path: files.ca.clone() });
        }
        let mut roots = RootCertStore::empty();
        for ca in &cas {
            roots.add(ca.clone()).map_err(|e| read_err("the CA certificate", &files.ca, &e))?;
        }
        let chain = CertificateDer::pem_file_iter(&files.cert)
            .map_err(|e| read_err("the certificate", &files.cert, &e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| read_err("the certificate", &files.cert, &e))?;
        if chain.is_empty() {
            return Err(TlsError::Empty { what: "certificate", path: files.cert.clone() });
        }
        let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| read_err("the private key", &files.key, &e))?;
        Ok(Identity { roots: Arc::new(roots), cas, chain, key })
    }

    /// The id our own certificate gives us.
    pub fn id(&self) -> Result<Id, TlsError> {
        PeerIdentity::of_certificate(&self.chain[0])
            .map(|p| p.id)
            .ok_or_else(|| TlsError::Config("our own certificate does not parse".into()))
    }
}

/// The rustls crypto provider used everywhere (ring).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// An identity's key as a signer, and a checker of node and client chains against its CA: what
/// signed membership entries and sealed archive manifests both use.
pub struct Signing {
    /// Signs with the identity's key.
    pub signer: Arc<dyn rustls::sign::SigningKey>,
    /// Checks that a chain leads to the identity's CA (as a TLS server checks a client's).
    pub verifier: Arc<dyn rustls::server::danger::ClientCertVerifier>,
}

impl std::fmt::Debug for Signing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signing").field("scheme", &self.signer.algorithm()).finish_non_exhaustive()
    }
}

/// Signature schemes timeshard signs with, in order of preference (the key decides).
const SIGNATURE_SCHEMES: [rustls::SignatureScheme; 5] = [
    rustls::SignatureScheme::ED25519,
    rustls::SignatureScheme::ECDSA_NISTP256_SHA256,
    rustls::SignatureScheme::ECDSA_NISTP384_SHA384,
    rustls::SignatureScheme::RSA_PSS_SHA256,
    rustls::SignatureScheme::RSA_PKCS1_SHA256,
];

/// Signs `message` with `signer`: the TLS scheme code used and the signature, for
/// [`signed_by`] to check.
pub fn sign(signer: &dyn rustls::sign::SigningKey, message: &[u8]) -> Result<(u16, Vec<u8>), TlsError> {
    let signer = signer
        .choose_scheme(&SIGNATURE_SCHEMES)
        .ok_or_else(|| TlsError::Config("the key type signs with no scheme timeshard uses".into()))?;
    let signature = signer.sign(message).map_err(|e| TlsError::Config(format!("signing failed: {e}")))?;
    Ok((u16::from(signer.scheme()), signature))
}

impl Signing {
    /// The signer and chain checker of `identity`.
    pub fn of(identity: &Identity) -> Result<Signing, TlsError> {
        let provider = provider();
        let signer = provider
            .key_provider
            .load_private_key(identity.key.clone_key())
            .map_err(|e| TlsError::Config(format!("the key cannot sign: {e}")))?;
        let verifier = client_verifier(identity, provider)?;
        Ok(Signing { signer, verifier })
    }
}

/// Whether the key of `cert` made `signature` over `message` with TLS signature scheme
/// `scheme` (its code); false for an unknown scheme or a certificate that does not parse.
pub fn signed_by(cert: &CertificateDer<'_>, scheme: u16, message: &[u8], signature: &[u8]) -> bool {
    static ALGORITHMS: std::sync::OnceLock<rustls::crypto::WebPkiSupportedAlgorithms> = std::sync::OnceLock::new();
    let algorithms = ALGORITHMS.get_or_init(|| provider().signature_verification_algorithms);
    let Some(algs) = algorithms.mapping.iter().find(|(s, _)| u16::from(*s) == scheme).map(|(_, algs)| *algs) else {
        return false;
    };
    let Ok(cert) = webpki::EndEntityCert::try_from(cert) else { return false };
    algs.iter().any(|alg| cert.verify_signature(*alg, message, signature).is_ok())
}

/// Checks peers' client certificates against `identity`'s CA, accepting those expired less than
/// [`EXPIRED_CERT_GRACE`] ago (see [`GraceClientVerifier`]).
pub fn client_verifier(
    identity: &Identity,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let inner = rustls::server::WebPkiClientVerifier::builder_with_provider(identity.roots.clone(), provider)
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    Ok(Arc::new(GraceClientVerifier { inner, grace: EXPIRED_CERT_GRACE }))
}

/// QUIC client configuration presenting `identity` and trusting its CA (servers' certificates
/// expired less than [`EXPIRED_CERT_GRACE`] ago included).
pub fn client_config(identity: &Identity) -> Result<quinn::ClientConfig, TlsError> {
    let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(identity.roots.clone(), provider())
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let verifier = Arc::new(GraceServerVerifier { inner, grace: EXPIRED_CERT_GRACE });
    let mut crypto = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(identity.chain.clone(), identity.key.clone_key())
        .map_err(|e| TlsError::Config(e.to_string()))?;
    crypto.alpn_protocols = vec![ALPN.to_vec()];
    // No 0-RTT: early data could be replayed, and writes must not be.
    crypto.enable_early_data = false;
    let quic =
        quinn::crypto::rustls::QuicClientConfig::try_from(crypto).map_err(|e| TlsError::Config(e.to_string()))?;
    Ok(quinn::ClientConfig::new(Arc::new(quic)))
}

/// What a peer's certificate says about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerIdentity {
    /// SHA-1 of the certificate's public key.
    pub id: Id,
    /// Whether the certificate names [`NODE_NAME`].
    pub is_node: bool,
}

impl PeerIdentity {
    /// Reads the id and role from a certificate (already verified by rustls).
    pub fn of_certificate(cert: &CertificateDer<'_>) -> Option<PeerIdentity> {
        let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
        let id = Id::of_public_key(parsed.public_key().raw);
        let is_node = parsed
            .subject_alternative_name()
            .ok()
            .flatten()
            .map(|san| {
                san.value
                    .general_names
                    .iter()
                    .any(|n| matches!(n, x509_parser::extensions::GeneralName::DNSName(d) if *d == NODE_NAME))
            })
            .unwrap_or(false);
        Some(PeerIdentity { id, is_node })
    }

    /// The identity of the peer at the other end of `conn`.
    pub fn of_connection(conn: &quinn::Connection) -> Option<PeerIdentity> {
        let certs = conn.peer_identity()?.downcast::<Vec<CertificateDer<'static>>>().ok()?;
        PeerIdentity::of_certificate(certs.first()?)
    }
}
