//! A development certificate authority: creates a CA and issues node and client certificates
//! signed by it, as PEM files. A fleet with a control plane gets its certificates from there
//! instead; nothing else in the node cares where they came from.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

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

/// Lifetime of a development CA unless told otherwise.
pub const CA_LIFETIME: Duration = Duration::from_secs(5 * 365 * 86_400);
/// Lifetime of a development certificate unless told otherwise.
pub const CERT_LIFETIME: Duration = Duration::from_secs(365 * 86_400);
/// How far back validity starts, for machines whose clocks lag.
const BACKDATE: Duration = Duration::from_secs(300);

/// Validity from a little before now for `lifetime`.
fn validity(params: &mut CertificateParams, lifetime: Duration) -> Result<time::OffsetDateTime> {
    let now = time::OffsetDateTime::now_utc();
    let lifetime = time::Duration::try_from(lifetime).context("lifetime too long")?;
    let not_after = now.checked_add(lifetime).context("lifetime too long")?;
    params.not_before = now - time::Duration::try_from(BACKDATE).expect("a few minutes");
    params.not_after = not_after;
    Ok(not_after)
}

/// Creates `dir/ca.pem` and `dir/ca.key`, valid for [`CA_LIFETIME`]. Refuses to overwrite an
/// existing CA.
pub fn init(dir: &Path) -> Result<()> {
    init_valid_for(dir, CA_LIFETIME).map(|_| ())
}

/// [`init`] with the CA valid for `lifetime`; returns when it expires.
pub fn init_valid_for(dir: &Path, lifetime: Duration) -> Result<time::OffsetDateTime> {
    init_with_key(dir, lifetime, KeyPair::generate().context("cannot generate the CA key")?)
}

fn init_with_key(dir: &Path, lifetime: Duration, key_pair: KeyPair) -> Result<time::OffsetDateTime> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let (cert, key) = (dir.join("ca.pem"), dir.join("ca.key"));
    if cert.exists() || key.exists() {
        bail!("{} already holds a CA (ca.pem / ca.key); remove them first to start a new one", dir.display());
    }
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, "timeshard development CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let not_after = validity(&mut params, lifetime)?;
    let ca = params.self_signed(&key_pair)?;
    write_private(&key, &key_pair.serialize_pem())?;
    fs::write(&cert, ca.pem()).with_context(|| format!("cannot write {}", cert.display()))?;
    Ok(not_after)
}

/// Issues `dir/<name>.pem` and `dir/<name>.key` for `role`, signed by the CA in `dir`, valid
/// for [`CERT_LIFETIME`].
pub fn issue(dir: &Path, name: &str, role: Role) -> Result<TlsFiles> {
    issue_valid_for(dir, name, role, CERT_LIFETIME).map(|(files, _)| files)
}

/// [`issue`] valid for `lifetime`; returns the files and when the certificate expires.
pub fn issue_valid_for(
    dir: &Path,
    name: &str,
    role: Role,
    lifetime: Duration,
) -> Result<(TlsFiles, time::OffsetDateTime)> {
    issue_with_key(dir, name, role, lifetime, KeyPair::generate()?)
}

fn issue_with_key(
    dir: &Path,
    name: &str,
    role: Role,
    lifetime: Duration,
    key_pair: KeyPair,
) -> Result<(TlsFiles, time::OffsetDateTime)> {
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        bail!("certificate name {name:?} must be letters, digits, - and _ only (it names the files)");
    }
    let ca_pem = fs::read_to_string(dir.join("ca.pem"))
        .with_context(|| format!("no CA in {}: run `timeshard pki init {}` first", dir.display(), dir.display()))?;
    let ca_key = KeyPair::from_pem(&fs::read_to_string(dir.join("ca.key")).context("cannot read ca.key")?)
        .context("ca.key is not a valid private key")?;
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key).context("ca.pem is not a valid CA certificate")?;
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
    let not_after = validity(&mut params, lifetime)?;
    let cert = params.signed_by(&key_pair, &issuer)?;
    let files = TlsFiles::in_dir(dir, name);
    write_private(&files.key, &key_pair.serialize_pem())?;
    fs::write(&files.cert, cert.pem()).with_context(|| format!("cannot write {}", files.cert.display()))?;
    Ok((files, not_after))
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

/// [`dev_pki`] in a new `dir` with every key derived from `seed`. Node ids come from keys, so
/// a cluster made twice from one seed places every block alike: what a benchmark comparing
/// placements measures then repeats, and differs only between seeds.
pub fn dev_pki_seeded(dir: &Path, nodes: usize, seed: u64) -> Result<PathBuf> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut key = || ed25519_key_from_seed(rng.random());
    init_with_key(dir, CA_LIFETIME, key()?)?;
    for i in 0..nodes {
        issue_with_key(dir, &format!("node-{i}"), Role::Node, CERT_LIFETIME, key()?)?;
    }
    issue_with_key(dir, "client", Role::Client, CERT_LIFETIME, key()?)?;
    Ok(dir.to_path_buf())
}

/// The DER prefix of a PKCS #8 v1 Ed25519 private key; the 32-byte seed follows.
const ED25519_PKCS8_PREFIX: [u8; 16] =
    [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];

/// The Ed25519 key of 32 seed bytes (rcgen signs with it deterministically).
pub fn ed25519_key_from_seed(seed: [u8; 32]) -> Result<KeyPair> {
    let mut der = ED25519_PKCS8_PREFIX.to_vec();
    der.extend_from_slice(&seed);
    KeyPair::from_pkcs8_der_and_sign_algo(&rustls_pki_types::PrivatePkcs8KeyDer::from(der), &rcgen::PKCS_ED25519)
        .context("an Ed25519 key from seed bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seeded_pki_repeats_its_keys_and_another_seed_does_not() {
        let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        for (d, seed) in dirs.iter().zip([7, 7, 8]) {
            dev_pki_seeded(d.path(), 2, seed).unwrap();
        }
        let key = |d: &tempfile::TempDir, name: &str| fs::read_to_string(d.path().join(name)).unwrap();
        for name in ["ca.key", "node-0.key", "node-1.key", "client.key"] {
            assert_eq!(key(&dirs[0], name), key(&dirs[1], name), "{name}");
            assert_ne!(key(&dirs[0], name), key(&dirs[2], name), "{name}");
        }
        assert_ne!(key(&dirs[0], "node-0.key"), key(&dirs[0], "node-1.key"));
        // Certificates issued later from the seeded CA verify against it as any other.
        issue(dirs[0].path(), "late", Role::Node).unwrap();
        assert!(dev_pki_seeded(dirs[0].path(), 2, 7).unwrap_err().to_string().contains("already holds a CA"));
    }

    #[test]
    fn a_certificate_expired_within_the_grace_is_accepted_and_one_past_it_or_from_another_ca_is_not() {
        use rustls::pki_types::UnixTime;
        use timeshard_sdk::tls::{EXPIRED_CERT_GRACE, Identity, client_verifier, provider};
        let (fleet, other) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        init(fleet.path()).unwrap();
        init(other.path()).unwrap();
        let (files, expires) = issue_valid_for(fleet.path(), "brief", Role::Node, Duration::from_secs(1)).unwrap();
        let (foreign, _) = issue_valid_for(other.path(), "foreign", Role::Node, Duration::from_secs(1)).unwrap();
        let identity = Identity::load(&files).unwrap();
        let verifier = client_verifier(&identity, provider()).unwrap();
        let chain = |files: &TlsFiles| Identity::load(files).unwrap().chain;
        let at = |after_expiry: Duration| {
            UnixTime::since_unix_epoch(Duration::from_secs(expires.unix_timestamp() as u64) + after_expiry)
        };
        let verify = |files: &TlsFiles, after: Duration| {
            let chain = chain(files);
            verifier.verify_client_cert(&chain[0], &chain[1..], at(after)).map(|_| ())
        };
        verify(&files, Duration::from_secs(3600)).expect("an hour after expiry: within the grace");
        verify(&files, EXPIRED_CERT_GRACE - Duration::from_secs(1)).expect("just within the grace");
        let err = verify(&files, EXPIRED_CERT_GRACE + Duration::from_secs(60)).unwrap_err();
        assert!(err.to_string().to_lowercase().contains("expired"), "{err}");
        verify(&foreign, Duration::from_secs(3600)).expect_err("another CA's certificate, expired or not");
        verify(&foreign, Duration::ZERO).expect_err("another CA's certificate");
    }

    /// The `not_after` of the certificate in `pem`, as seconds since the epoch.
    fn not_after(pem: &Path) -> i64 {
        use rustls_pki_types::pem::PemObject as _;
        let der = rustls_pki_types::CertificateDer::from_pem_file(pem).unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).unwrap();
        cert.validity().not_after.timestamp()
    }

    #[test]
    fn development_certificates_have_explicit_lifetimes() {
        let dir = tempfile::tempdir().unwrap();
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        init(dir.path()).unwrap();
        let ca_left = not_after(&dir.path().join("ca.pem")) - now;
        assert!((ca_left - CA_LIFETIME.as_secs() as i64).abs() < 60, "the CA lives {ca_left} s");
        let (files, _) = issue_valid_for(dir.path(), "short", Role::Node, Duration::from_secs(86_400)).unwrap();
        let left = not_after(&files.cert) - now;
        assert!((left - 86_400).abs() < 60, "the certificate lives {left} s");
        let default = issue(dir.path(), "default", Role::Client).unwrap();
        let left = not_after(&default.cert) - now;
        assert!((left - CERT_LIFETIME.as_secs() as i64).abs() < 60, "the certificate lives {left} s");
    }
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
