//! TLS to the control plane. The control plane's server certificate is issued by the fleet CA
//! and names [`CONTROL_NAME`], whatever host it is reached by; node certificates never carry that
//! name, so a node cannot pose as the control plane.
//!
//! Before a device has the CA, it trusts only a CA whose fingerprint equals the one in its token
//! ([`pinned_config`]): the server must send the CA in its chain, the CA's fingerprint must match,
//! and the server certificate must verify against that CA, all inside the handshake, before a
//! byte of the request (and its secret) is sent.

use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;

use crate::token::Fingerprint;

/// DNS name in the control plane's server certificate.
pub const CONTROL_NAME: &str = "control.timeshard";
/// DNS name in every node certificate: the one the SDK and the node use.
pub use timeshard_proto::wire::NODE_NAME;

/// TLS setup failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    #[error("invalid PEM in {what}: {reason}")]
    Pem { what: &'static str, reason: String },
    #[error("invalid TLS configuration: {0}")]
    Config(String),
}

/// The rustls crypto provider (ring), as everywhere in timeshard.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates in a PEM text.
pub fn certs_from_pem(what: &'static str, pem: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem { what, reason: e.to_string() })?;
    if certs.is_empty() {
        return Err(TlsError::Pem { what, reason: "no certificate in it".into() });
    }
    Ok(certs)
}

/// The private key in a PEM text.
pub fn key_from_pem(what: &'static str, pem: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| TlsError::Pem { what, reason: e.to_string() })
}

fn builder() -> Result<rustls::ConfigBuilder<ClientConfig, rustls::WantsVerifier>, TlsError> {
    ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Config(e.to_string()))
}

/// A client configuration that trusts only a CA with fingerprint `pin`, which the server must
/// send in its chain. Used with enrollment and API tokens.
pub fn pinned_config(pin: Fingerprint) -> Result<Arc<ClientConfig>, TlsError> {
    let verifier = Arc::new(PinnedCa { pin, provider: provider() });
    Ok(Arc::new(builder()?.dangerous().with_custom_certificate_verifier(verifier).with_no_client_auth()))
}

/// A client configuration for an enrolled node: trusts the fleet CA and presents the node's
/// certificate (mutual TLS).
pub fn node_config(ca_pem: &str, cert_pem: &str, key_pem: &str) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    for ca in certs_from_pem("the fleet CA", ca_pem)? {
        roots.add(ca).map_err(|e| TlsError::Pem { what: "the fleet CA", reason: e.to_string() })?;
    }
    let chain = certs_from_pem("the node certificate", cert_pem)?;
    let key = key_from_pem("the node key", key_pem)?;
    let config = builder()?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    Ok(Arc::new(config))
}

/// Trusts the one CA in the server's chain whose fingerprint is the pin.
#[derive(Debug)]
struct PinnedCa {
    pin: Fingerprint,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PinnedCa {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let mut seen = Vec::new();
        let ca = intermediates.iter().find(|c| match Fingerprint::of_certificate(c) {
            Ok(f) => {
                seen.push(f.to_string());
                f == self.pin
            }
            Err(_) => false,
        });
        let Some(ca) = ca else {
            return Err(rustls::Error::General(format!(
                "the server's CA (fingerprint {}) is not the fleet CA named by the token ({}): \
                 wrong control plane, wrong fleet, or someone in between; nothing was sent",
                if seen.is_empty() { "none sent".to_string() } else { seen.join(", ") },
                self.pin
            )));
        };
        let mut roots = RootCertStore::empty();
        roots.add(ca.clone().into_owned()).map_err(|e| rustls::Error::General(format!("the fleet CA: {e}")))?;
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), self.provider.clone())
            .build()
            .map_err(|e| rustls::Error::General(e.to_string()))?;
        webpki.verify_server_cert(end_entity, &[], server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}
