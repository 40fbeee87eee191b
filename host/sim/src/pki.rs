//! Certificates for a simulated fleet, all derived from the seed: node ids come from TLS keys,
//! so a seed that chose its keys at random would place blocks differently on every run.
//! Ed25519 keys are made from 32 seed bytes (PKCS #8 v1); rcgen signs deterministically.

use std::path::Path;

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    PKCS_ED25519,
};
use rustls_pki_types::PrivatePkcs8KeyDer;
use timeshard_sdk::tls::{CLIENT_NAME, NODE_NAME, TlsFiles};
use timeshard_store::faulty_disk::SplitMix64;

/// The DER prefix of a PKCS #8 v1 Ed25519 private key; the 32-byte seed follows.
const ED25519_PKCS8_PREFIX: [u8; 16] =
    [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];

fn key_from(rng: &mut SplitMix64) -> Result<KeyPair> {
    let mut der = ED25519_PKCS8_PREFIX.to_vec();
    for _ in 0..4 {
        der.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    KeyPair::from_pkcs8_der_and_sign_algo(&PrivatePkcs8KeyDer::from(der), &PKCS_ED25519)
        .context("an Ed25519 key from seed bytes")
}

/// A fleet CA in `dir` and the means to issue from it.
pub struct Pki {
    dir: std::path::PathBuf,
    issuer: Issuer<'static, KeyPair>,
    rng: SplitMix64,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki").field("dir", &self.dir).finish_non_exhaustive()
    }
}

impl Pki {
    /// A CA whose key, and every key issued after, derive from `seed`.
    pub fn new(dir: &Path, seed: u64) -> Result<Pki> {
        std::fs::create_dir_all(dir)?;
        let mut rng = SplitMix64(seed ^ 0x5EED_CA00);
        let key = key_from(&mut rng)?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, "timeshard simulated CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let ca = params.self_signed(&key)?;
        std::fs::write(dir.join("ca.pem"), ca.pem())?;
        let issuer = Issuer::new(params, key);
        Ok(Pki { dir: dir.to_path_buf(), issuer, rng })
    }

    /// Issues `<name>.pem` and `<name>.key`, a node's or a client's.
    pub fn issue(&mut self, name: &str, node: bool) -> Result<TlsFiles> {
        let key = key_from(&mut self.rng)?;
        let sans = if node { vec![NODE_NAME.to_string()] } else { vec![CLIENT_NAME.to_string()] };
        let mut params = CertificateParams::new(sans)?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = if node {
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth]
        } else {
            vec![ExtendedKeyUsagePurpose::ClientAuth]
        };
        let cert = params.signed_by(&key, &self.issuer)?;
        let files = TlsFiles::in_dir(&self.dir, name);
        std::fs::write(&files.cert, cert.pem())?;
        std::fs::write(&files.key, key.serialize_pem())?;
        Ok(files)
    }
}
