//! The fleet CA: makes the CA once, signs node certificates from CSRs, and issues the control
//! plane's own server certificate. No I/O: the key is stored in the database (the fleet row) and
//! used here in memory only.
//!
//! A node certificate takes nothing from the CSR but its public key: names, usages and
//! lifetime are the CA's choice, the same as `timeshard pki issue --role node` gives (SAN
//! `node.timeshard`, server and client authentication).

use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SerialNumber,
};
use rustls_pki_types::CertificateDer;
use timeshard_control_api::tls::{CONTROL_NAME, NODE_NAME};
use timeshard_control_api::token::{Fingerprint, hex, random_hex, unhex};
use timeshard_proto::Id;

use crate::error::Error;

/// How far back a certificate's validity starts, for devices whose clocks lag.
const BACKDATE: Duration = Duration::from_secs(300);
/// Lifetime of the CA certificate.
const CA_LIFETIME: Duration = Duration::from_secs(20 * 365 * 86_400);

/// The fleet CA, loaded.
pub struct FleetCa {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
    fingerprint: Fingerprint,
}

impl std::fmt::Debug for FleetCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetCa").field("fingerprint", &self.fingerprint).finish()
    }
}

/// A certificate just signed.
#[derive(Debug, Clone)]
pub struct Signed {
    pub pem: String,
    pub serial: String,
    pub not_after_ms: i64,
}

/// A verified CSR and the node id its key gives.
#[derive(Debug)]
pub struct Csr {
    params: CertificateSigningRequestParams,
    pub node_id: String,
}

/// Parses a PEM CSR and checks its signature (the requester holds the key).
pub fn parse_csr(pem: &str) -> Result<Csr, Error> {
    if pem.len() > 16 * 1024 {
        return Err(Error::CsrInvalid("longer than 16 KiB".into()));
    }
    let der = rustls_pki_types::pem::PemObject::from_pem_slice(pem.as_bytes())
        .map_err(|e: rustls_pki_types::pem::Error| Error::CsrInvalid(format!("not PEM: {e}")))?;
    let der: rustls_pki_types::CertificateSigningRequestDer<'static> = der;
    let params = CertificateSigningRequestParams::from_der(&der).map_err(|e| Error::CsrInvalid(e.to_string()))?;
    use x509_parser::prelude::FromDer;
    let (_, parsed) = x509_parser::certification_request::X509CertificationRequest::from_der(der.as_ref())
        .map_err(|e| Error::CsrInvalid(e.to_string()))?;
    let node_id = Id::of_public_key(parsed.certification_request_info.subject_pki.raw).to_hex();
    Ok(Csr { params, node_id })
}

fn at(ms: i64) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

fn random_serial() -> SerialNumber {
    // 16 random bytes with the top bit clear: a positive serial of at most 128 bits.
    let mut bytes = unhex(&random_hex(16)).expect("hex");
    bytes[0] &= 0x7f;
    SerialNumber::from_slice(&bytes)
}

impl FleetCa {
    /// A new CA: its certificate PEM and private key PEM, for the database.
    pub fn generate(now_ms: i64) -> Result<(String, String), Error> {
        let internal = |e: rcgen::Error| Error::Internal(format!("cannot create the fleet CA: {e}"));
        let key = KeyPair::generate().map_err(internal)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(internal)?;
        params.distinguished_name.push(DnType::CommonName, "timeshard fleet CA");
        // Path length 0: it signs node and server certificates, never another CA.
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        params.not_before = at(now_ms - crate::time::ms(BACKDATE));
        params.not_after = at(now_ms + crate::time::ms(CA_LIFETIME));
        params.serial_number = Some(random_serial());
        let cert = params.self_signed(&key).map_err(internal)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// Loads the CA from its PEM texts.
    pub fn load(cert_pem: &str, key_pem: &str) -> Result<FleetCa, Error> {
        let internal = |e: &dyn std::fmt::Display| Error::Internal(format!("the stored fleet CA is unusable: {e}"));
        let key = KeyPair::from_pem(key_pem).map_err(|e| internal(&e))?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key).map_err(|e| internal(&e))?;
        let cert_der =
            timeshard_control_api::tls::certs_from_pem("the fleet CA", cert_pem).map_err(|e| internal(&e))?.remove(0);
        let fingerprint = Fingerprint::of_certificate(&cert_der).map_err(|e| internal(&e))?;
        Ok(FleetCa { cert_pem: cert_pem.to_string(), cert_der, issuer, fingerprint })
    }

    /// Signs `msg` with the CA's key: the TLS `SignatureScheme` code and the signature, which
    /// nodes check with the CA certificate they trust.
    pub fn sign(&self, msg: &[u8]) -> Result<(u16, Vec<u8>), Error> {
        use rcgen::SigningKey as _;
        let key = self.issuer.key();
        let alg = key.algorithm();
        let scheme: u16 = if alg == &rcgen::PKCS_ECDSA_P256_SHA256 {
            0x0403
        } else if alg == &rcgen::PKCS_ECDSA_P384_SHA384 {
            0x0503
        } else if alg == &rcgen::PKCS_ED25519 {
            0x0807
        } else {
            return Err(Error::Internal(format!("the fleet CA's key ({alg:?}) cannot sign documents")));
        };
        let signature =
            key.sign(msg).map_err(|e| Error::Internal(format!("cannot sign with the fleet CA's key: {e}")))?;
        Ok((scheme, signature))
    }

    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// Signs a node certificate for the key in `csr`, valid for `lifetime` from `now_ms`.
    pub fn sign_node(&self, csr: &Csr, now_ms: i64, lifetime: Duration) -> Result<Signed, Error> {
        let internal = |e: rcgen::Error| Error::Internal(format!("cannot sign the node certificate: {e}"));
        let mut params = CertificateParams::new(vec![NODE_NAME.to_string()]).map_err(internal)?;
        params.distinguished_name.push(DnType::CommonName, format!("timeshard node {}", csr.node_id));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let not_after_ms = now_ms + crate::time::ms(lifetime);
        // At most a tenth of the lifetime: nodes renew after two thirds of not_before..not_after,
        // and 5 minutes back would make a short-lived certificate due at once, again and again.
        params.not_before = at(now_ms - crate::time::ms(BACKDATE.min(lifetime / 10)));
        params.not_after = at(not_after_ms);
        let serial = random_serial();
        params.serial_number = Some(serial.clone());
        params.use_authority_key_identifier_extension = true;
        let request = CertificateSigningRequestParams { params, public_key: csr.params.public_key.clone() };
        let cert = request.signed_by(&self.issuer).map_err(internal)?;
        // The certificate carries whole seconds.
        let not_after_ms = not_after_ms - not_after_ms.rem_euclid(1000);
        Ok(Signed { pem: cert.pem(), serial: hex(&serial.to_bytes()), not_after_ms })
    }

    /// A fresh server certificate for the control plane (SAN [`CONTROL_NAME`]) and its key.
    pub fn sign_server(&self, now_ms: i64, lifetime: Duration) -> Result<(CertificateDer<'static>, KeyPair), Error> {
        let internal = |e: rcgen::Error| Error::Internal(format!("cannot issue the server certificate: {e}"));
        let key = KeyPair::generate().map_err(internal)?;
        let mut params = CertificateParams::new(vec![CONTROL_NAME.to_string()]).map_err(internal)?;
        params.distinguished_name.push(DnType::CommonName, "timeshard control plane");
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_before = at(now_ms - crate::time::ms(BACKDATE));
        params.not_after = at(now_ms + crate::time::ms(lifetime));
        params.serial_number = Some(random_serial());
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &self.issuer).map_err(internal)?;
        Ok((cert.der().clone(), key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use timeshard_control_api::agent::node_id_of;

    #[test]
    fn node_certificates_bind_the_csr_key_and_nothing_else() {
        let now = crate::time::now_ms();
        let (cert, key) = FleetCa::generate(now).unwrap();
        let ca = FleetCa::load(&cert, &key).unwrap();
        let node_key = KeyPair::generate().unwrap();
        // The requester asks for a CA certificate with another name; it gets a node certificate.
        let mut asked = CertificateParams::new(vec!["control.timeshard".to_string()]).unwrap();
        asked.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let csr_pem = asked.serialize_request(&node_key).unwrap().pem().unwrap();
        let csr = parse_csr(&csr_pem).unwrap();
        assert_eq!(csr.node_id, node_id_of(&node_key));
        let signed = ca.sign_node(&csr, now, Duration::from_secs(3600)).unwrap();
        let der = timeshard_control_api::tls::certs_from_pem("c", &signed.pem).unwrap().remove(0);
        let (_, parsed) = x509_parser::parse_x509_certificate(&der).unwrap();
        assert_eq!(Id::of_public_key(parsed.public_key().raw).to_hex(), csr.node_id);
        assert!(!parsed.is_ca());
        let sans: Vec<String> = parsed
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert_eq!(sans, vec![format!("DNSName({NODE_NAME})")]);
        assert_eq!(parsed.validity().not_after.timestamp() * 1000, signed.not_after_ms);
        // Backdated 5 minutes for lagging clocks, but never more than a tenth of the lifetime:
        // a 1-minute certificate backdated 5 minutes was due for renewal the moment it arrived.
        assert!(now / 1000 - parsed.validity().not_before.timestamp() >= 299);
        let short = ca.sign_node(&csr, now, Duration::from_secs(60)).unwrap();
        let der = timeshard_control_api::tls::certs_from_pem("c", &short.pem).unwrap().remove(0);
        let (_, parsed) = x509_parser::parse_x509_certificate(&der).unwrap();
        let backdated = now / 1000 - parsed.validity().not_before.timestamp();
        assert!((5..=7).contains(&backdated), "backdated {backdated} s");
    }

    #[test]
    fn malformed_csrs_are_refused() {
        assert!(matches!(parse_csr("hello"), Err(Error::CsrInvalid(_))));
        let key = KeyPair::generate().unwrap();
        let pem = CertificateParams::default().serialize_request(&key).unwrap().pem().unwrap();
        // Flip a byte in the middle of the signed content: the signature no longer verifies.
        let mut lines: Vec<String> = pem.lines().map(String::from).collect();
        let mid = &mut lines[2];
        let c = if mid.starts_with('A') { "B" } else { "A" };
        mid.replace_range(0..1, c);
        let err = parse_csr(&lines.join("\n")).unwrap_err();
        assert!(matches!(err, Error::CsrInvalid(_)), "{err}");
    }
}
