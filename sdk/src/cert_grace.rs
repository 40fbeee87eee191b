//! Certificates that expired a short while ago, still accepted: a device whose control plane was
//! away for longer than a certificate's life keeps talking to its peers, restarts and rejoins,
//! and renews once the control plane is back.
//!
//! A chain that fails only because its end-entity certificate expired is checked again as of
//! that certificate's last valid second, if that was no more than [`EXPIRED_CERT_GRACE`] ago:
//! everything else (the CA's signature, names, usages, the CA's own validity) must hold as it
//! did then. Revocation does not depend on expiry: revoked node ids are refused whatever their
//! certificates' dates.

use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};

/// How long after its expiry a certificate is still accepted (14 days): the longest a fleet may
/// go without its control plane before its devices must enroll again.
pub const EXPIRED_CERT_GRACE: Duration = Duration::from_secs(14 * 86_400);

/// The last second `cert` is valid, from its `notAfter` (Unix seconds).
fn not_after(cert: &CertificateDer<'_>) -> Option<u64> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    u64::try_from(parsed.validity().not_after.timestamp()).ok()
}

/// `verify` as of `now`, or, when that fails only because `cert` expired no more than `grace`
/// before `now`, as of `cert`'s last valid second.
pub fn verify_within_grace<T>(
    cert: &CertificateDer<'_>,
    now: UnixTime,
    grace: Duration,
    verify: impl Fn(UnixTime) -> Result<T, Error>,
) -> Result<T, Error> {
    let first = verify(now);
    let Err(Error::InvalidCertificate(CertificateError::Expired | CertificateError::ExpiredContext { .. })) = &first
    else {
        return first;
    };
    match not_after(cert) {
        Some(end) if now.as_secs() >= end && now.as_secs() - end <= grace.as_secs() => {
            verify(UnixTime::since_unix_epoch(Duration::from_secs(end))).or(first)
        }
        _ => first,
    }
}

/// A client certificate verifier that accepts recently expired certificates (see the module
/// docs); everything else is `inner`'s.
#[derive(Debug)]
pub struct GraceClientVerifier {
    pub inner: Arc<dyn ClientCertVerifier>,
    pub grace: Duration,
}

impl ClientCertVerifier for GraceClientVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        verify_within_grace(end_entity, now, self.grace, |at| {
            self.inner.verify_client_cert(end_entity, intermediates, at)
        })
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A server certificate verifier that accepts recently expired certificates (see the module
/// docs); everything else is `inner`'s.
#[derive(Debug)]
pub struct GraceServerVerifier {
    pub inner: Arc<dyn ServerCertVerifier>,
    pub grace: Duration,
}

impl ServerCertVerifier for GraceServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        verify_within_grace(end_entity, now, self.grace, |at| {
            self.inner.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, at)
        })
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
