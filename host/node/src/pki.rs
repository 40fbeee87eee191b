//! A development certificate authority: creates a CA and issues node and client certificates
//! signed by it, as PEM files. A fleet with a control plane gets its certificates from there
//! instead; nothing else in the node cares where they came from.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use timeshard_sdk::tls::{CLIENT_NAME, NODE_NAME, TlsFiles};

/// What a certificate is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A node: serves peers and clients, and is a client of its peers.
    Node,
    /// A client: may write and read, never act as a peer.
    Client,
}

fn write_private(path: &Path, contents: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(contents.as_bytes()).with_context(|| format!("cannot write {}", path.display()))
}

/// Creates `dir/ca.pem` and `dir/ca.key`. Refuses to overwrite an existing CA.
pub fn init(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let (cert, key) = (dir.join("ca.pem"), dir.join("ca.key"));
    if cert.exists() || key.exists() {
        bail!("{} already holds a CA (ca.pem / ca.key); remove them first to start a new one", dir.display());
    }
    let key_pair = KeyPair::generate().context("cannot generate the CA key")?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, "timeshard development CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca = params.self_signed(&key_pair)?;
    write_private(&key, &key_pair.serialize_pem())?;
    fs::write(&cert, ca.pem()).with_context(|| format!("cannot write {}", cert.display()))?;
    Ok(())
}

/// Issues `dir/<name>.pem` and `dir/<name>.key` for `role`, signed by the CA in `dir`.
pub fn issue(dir: &Path, name: &str, role: Role) -> Result<TlsFiles> {
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        bail!("certificate name {name:?} must be letters, digits, - and _ only (it names the files)");
    }
    let ca_pem = fs::read_to_string(dir.join("ca.pem"))
        .with_context(|| format!("no CA in {}: run `timeshard pki init {}` first", dir.display(), dir.display()))?;
    let ca_key = KeyPair::from_pem(&fs::read_to_string(dir.join("ca.key")).context("cannot read ca.key")?)
        .context("ca.key is not a valid private key")?;
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key).context("ca.pem is not a valid CA certificate")?;
    let key_pair = KeyPair::generate()?;
    let sans = match role {
        Role::Node => vec![NODE_NAME.to_string(), "localhost".to_string()],
        Role::Client => vec![CLIENT_NAME.to_string()],
    };
    let mut params = CertificateParams::new(sans)?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = match role {
        Role::Node => vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth],
        Role::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
    };
    let cert = params.signed_by(&key_pair, &issuer)?;
    let files = TlsFiles::in_dir(dir, name);
    write_private(&files.key, &key_pair.serialize_pem())?;
    fs::write(&files.cert, cert.pem()).with_context(|| format!("cannot write {}", files.cert.display()))?;
    Ok(files)
}

/// A development PKI in `dir` with a CA, `nodes` node certificates (`node-0` ...) and one client
/// certificate (`client`); existing files are reused.
pub fn dev_pki(dir: &Path, nodes: usize) -> Result<PathBuf> {
    if !dir.join("ca.pem").exists() {
        init(dir)?;
    }
    for i in 0..nodes {
        if !dir.join(format!("node-{i}.pem")).exists() {
            issue(dir, &format!("node-{i}"), Role::Node)?;
        }
    }
    if !dir.join("client.pem").exists() {
        issue(dir, "client", Role::Client)?;
    }
    Ok(dir.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;
    use timeshard_sdk::tls::{Identity, PeerIdentity};

    #[test]
    fn issued_certificates_carry_role_and_key_bound_id() {
        let dir = tempfile::tempdir().unwrap();
        dev_pki(dir.path(), 2).unwrap();
        let node = Identity::load(&TlsFiles::in_dir(dir.path(), "node-0")).unwrap();
        let client = Identity::load(&TlsFiles::in_dir(dir.path(), "client")).unwrap();
        let n = PeerIdentity::of_certificate(&node.chain[0]).unwrap();
        let c = PeerIdentity::of_certificate(&client.chain[0]).unwrap();
        assert!(n.is_node && !c.is_node);
        assert_ne!(n.id, c.id);
        let other = Identity::load(&TlsFiles::in_dir(dir.path(), "node-1")).unwrap();
        assert_ne!(n.id, other.id().unwrap());
        // A second init refuses to clobber the CA.
        assert!(init(dir.path()).is_err());
        assert!(issue(dir.path(), "../evil", Role::Node).is_err());
    }
}
