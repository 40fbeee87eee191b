//! Certificates for a simulated fleet, all derived from the seed: node ids come from TLS keys,
//! so a seed that chose its keys at random would place blocks differently on every run.
//! Ed25519 keys are made from 32 seed bytes ([`timeshard_node::pki::ed25519_key_from_seed`]).

use std::path::Path;

use anyhow::Result;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use timeshard_sdk::tls::{CLIENT_NAME, NODE_NAME, TlsFiles};
use timeshard_store::faulty_disk::SplitMix64;

fn key_from(rng: &mut SplitMix64) -> Result<KeyPair> {
    let mut seed = [0u8; 32];
    for chunk in seed.chunks_exact_mut(8) {
        chunk.copy_from_slice(&rng.next_u64().to_le_bytes());
    }
    timeshard_node::pki::ed25519_key_from_seed(seed)
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
