//! Policy signatures: ed25519 keys, detached signatures over a module's hash and identity, and
//! their file formats. The CLI's `timeshard policy keygen` and `timeshard policy sign` call
//! [`generate_keypair`], [`SecretKey::write`] and [`sign_file`]; the control plane signs what it
//! accepts with [`sign`]; nodes call [`verify`] (through the registry) before compiling anything.
//!
//! File formats (text, one record per line, so they survive copy-paste and review):
//!
//! ```text
//! # secret key file (mode 0600), 32-byte seed in hex
//! timeshard-policy-secret-key-v1 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
//! # public key (a trusted key in node config, or a .pub file)
//! timeshard-policy-public-key-v1 3b6a27bcceb6a42d62a3a8d02a6f0d73653215771de243a63ac048a18b59da29
//! # detached signature, MODULE.wasm.sig
//! timeshard-policy-signature-v2
//! key 3b6a27bcceb6a42d62a3a8d02a6f0d73653215771de243a63ac048a18b59da29
//! name pmu-validate
//! version 1.3.0
//! kind ingest
//! sha256 <the module's sha256>
//! min-version 1.3.0          (optional: versions of this name below it are revoked)
//! sig <64-byte ed25519 signature over the signed message below, hex>
//! ```
//!
//! The signed message is the identity and the hash, one field a line (names and versions never
//! hold a newline):
//!
//! ```text
//! timeshard-policy-signature-v2
//! name pmu-validate
//! version 1.3.0
//! kind ingest
//! sha256 <hex>
//! min-version 1.3.0          (only when the signature carries one)
//! ```
//!
//! So a signature binds the exact bytes (through their hash) *and* what they may be installed
//! as: a signed `noop` cannot be installed as `pmu-validate`, a query policy as an ingest
//! policy, or version 1.0.0 as 1.1.0 ([`verify`] refuses each with
//! [`SigningError::WrongIdentity`]).
//!
//! A *minimum version* revokes the versions of the name below it: a node that installed a
//! module signed with `min-version 1.3.0` refuses `pmu-validate` 1.2.x and older from then on,
//! even with valid signatures (it remembers the floor across restarts), so a vulnerable old
//! version cannot be reinstated by replaying its signed files. Versions are compared as
//! semantic versions; a signature's minimum may not exceed its own version.
//!
//! The first format, `timeshard-policy-signature-v1` (the same lines without `name`, `version`
//! and `kind`, signing the module's bytes only), bound no identity. [`verify`] refuses it
//! ([`SigningError::Legacy`]) unless the caller allows it, for a migration: a node does with
//! `allow_v1_signatures = true` in `[policy]`, and warns each time.

use std::fmt;
use std::path::{Path, PathBuf};

use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

use crate::{Kind, PolicyRef};

const SECRET_TAG: &str = "timeshard-policy-secret-key-v1";
const PUBLIC_TAG: &str = "timeshard-policy-public-key-v1";
const SIGNATURE_TAG: &str = "timeshard-policy-signature-v2";
const SIGNATURE_V1_TAG: &str = "timeshard-policy-signature-v1";

/// Reading, parsing or checking keys and signatures failed.
#[derive(Debug, thiserror::Error)]
pub enum SigningError {
    #[error("cannot read or write {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} is malformed: {reason}; expected `{tag} <hex>` (generate one with `timeshard policy keygen`)")]
    BadKey { what: String, tag: &'static str, reason: String },
    #[error("signature is malformed: {0}; sign the module again with `timeshard policy sign`")]
    BadSignatureFile(String),
    #[error("the system random number generator failed: {0}")]
    Random(String),
    /// The signing key is not among the trusted keys.
    #[error("signed by key {key}, which is not trusted")]
    Untrusted { key: String },
    /// The signature does not match the bytes.
    #[error("the signature by key {key} does not match the bytes")]
    Mismatch { key: String },
    /// A valid signature, made for another name, version or kind than the module is installed as.
    #[error("it was signed as {signed}, not as {installing}")]
    WrongIdentity { signed: Identity, installing: Identity },
    /// A minimum version that is not a semantic version, or is above the signed version.
    #[error(
        "minimum version {min:?} cannot go with version {version:?}: both must be semantic versions (1.3.0), \
         and the minimum may not exceed the version signed"
    )]
    BadMinimum { min: String, version: String },
    /// A signature of the first format, which covers the bytes only, where it is not allowed.
    #[error(
        "its signature is of the old format (timeshard-policy-signature-v1), which does not bind the \
         module's name, version and kind"
    )]
    Legacy,
}

/// What a signature says a module is: its name, exact version and kind. Signed together with
/// the module's hash.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Identity {
    pub policy: PolicyRef,
    pub kind: Kind,
}

impl Identity {
    /// `name@version` of kind `kind`.
    pub fn new(policy: PolicyRef, kind: Kind) -> Identity {
        Identity { policy, kind }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({} policy)", self.policy, self.kind)
    }
}

/// The bytes a v2 signature signs: its tag, the identity, the hash and the minimum version if
/// any, one per line.
fn signed_message(identity: &Identity, sha256: &[u8; 32], min_version: Option<&semver::Version>) -> Vec<u8> {
    let mut text = format!(
        "{SIGNATURE_TAG}\nname {}\nversion {}\nkind {}\nsha256 {}\n",
        identity.policy.name,
        identity.policy.version,
        identity.kind,
        hex(sha256)
    );
    if let Some(min) = min_version {
        text.push_str(&format!("min-version {min}\n"));
    }
    text.into_bytes()
}

/// Checks that `min` may go with a signature of `version` (see [`SigningError::BadMinimum`]).
fn check_minimum(min: &str, version: &str) -> Result<semver::Version, SigningError> {
    let bad = || SigningError::BadMinimum { min: min.to_string(), version: version.to_string() };
    let parsed_min = semver::Version::parse(min).map_err(|_| bad())?;
    let parsed_version = semver::Version::parse(version).map_err(|_| bad())?;
    if parsed_min > parsed_version {
        return Err(bad());
    }
    Ok(parsed_min)
}

/// The sha256 of `bytes`: the content hash under which compiled components are cached.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

fn unhex<const N: usize>(s: &str) -> Result<[u8; N], String> {
    let s = s.trim();
    // Bytes, not chars: a multi-byte character must be refused, not sliced through (found by
    // fuzzing: slicing at a byte inside a character panicked).
    if !s.is_ascii() {
        return Err(format!("expected {} hex digits, found other characters", 2 * N));
    }
    if s.len() != 2 * N {
        return Err(format!("expected {} hex digits, found {}", 2 * N, s.len()));
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
            .map_err(|_| format!("{:?} is not hex", &s[2 * i..2 * i + 2]))?;
    }
    Ok(out)
}

/// The line after `tag`, from the first non-comment line of `text`.
fn tagged<'a>(text: &'a str, tag: &str) -> Result<&'a str, String> {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with('#')).ok_or("the text is empty")?;
    line.strip_prefix(tag).map(str::trim).ok_or_else(|| format!("it does not start with `{tag}`"))
}

/// A policy signing key. Keep it off the nodes: only its [`PublicKey`] goes there.
pub struct SecretKey(SigningKey);

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretKey(public {})", self.public())
    }
}

/// A policy verification key, trusted by the nodes that list it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PublicKey(VerifyingKey);

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

impl fmt::Display for PublicKey {
    /// The key in hex: it is short enough to be its own fingerprint.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(self.0.as_bytes()))
    }
}

/// A detached signature and the key that made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    key: PublicKey,
    /// What it was signed as; `None` for the first format, which signed the bytes only.
    identity: Option<Identity>,
    sha256: [u8; 32],
    /// Versions of the name below this one are revoked (v2 only).
    min_version: Option<semver::Version>,
    sig: ed25519_dalek::Signature,
}

/// A signature that [`verify`] accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified<'a> {
    /// The trusted key that signed.
    pub key: &'a PublicKey,
    /// Whether it is of the old format (accepted only when allowed): warn about it.
    pub legacy: bool,
    /// The versions of the module's name below this one are revoked.
    pub min_version: Option<semver::Version>,
}

/// Generates a new signing key from the operating system's random number generator.
pub fn generate_keypair() -> Result<SecretKey, SigningError> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| SigningError::Random(e.to_string()))?;
    Ok(SecretKey(SigningKey::from_bytes(&seed)))
}

/// Signs a module's hash and its identity (the current format).
pub fn sign(key: &SecretKey, module: &[u8], identity: &Identity) -> Signature {
    let hash = sha256(module);
    let sig = key.0.sign(&signed_message(identity, &hash, None));
    Signature { key: key.public(), identity: Some(identity.clone()), sha256: hash, min_version: None, sig }
}

/// Signs like [`sign`], revoking the versions of the module's name below `min_version` on every
/// node that installs it. Both versions must be semantic versions, the minimum at most the
/// module's own.
pub fn sign_revoking_below(
    key: &SecretKey,
    module: &[u8],
    identity: &Identity,
    min_version: &str,
) -> Result<Signature, SigningError> {
    let min = check_minimum(min_version, &identity.policy.version)?;
    let hash = sha256(module);
    let sig = key.0.sign(&signed_message(identity, &hash, Some(&min)));
    Ok(Signature { key: key.public(), identity: Some(identity.clone()), sha256: hash, min_version: Some(min), sig })
}

/// Signs a module's bytes only, in the first format, which binds no identity. Nodes refuse such
/// signatures unless configured otherwise; this exists to test that and to migrate.
pub fn sign_v1(key: &SecretKey, module: &[u8]) -> Signature {
    Signature { key: key.public(), identity: None, sha256: sha256(module), min_version: None, sig: key.0.sign(module) }
}

/// Checks that `signature` is by one of `trusted`, covers exactly `module`, and was made for
/// `installing` (name, version and kind). A signature of the first format (bytes only) is
/// refused unless `allow_v1`. Returns the key that signed.
pub fn verify<'a>(
    trusted: &'a TrustedKeys,
    module: &[u8],
    installing: &Identity,
    signature: &Signature,
    allow_v1: bool,
) -> Result<Verified<'a>, SigningError> {
    let key = trusted
        .0
        .iter()
        .find(|k| **k == signature.key)
        .ok_or_else(|| SigningError::Untrusted { key: signature.key.to_string() })?;
    let mismatch = || SigningError::Mismatch { key: key.to_string() };
    // Strict verification refuses weak keys and malleable signatures.
    let Some(signed) = &signature.identity else {
        if !allow_v1 {
            return Err(SigningError::Legacy);
        }
        key.0.verify_strict(module, &signature.sig).map_err(|_| mismatch())?;
        return Ok(Verified { key, legacy: true, min_version: None });
    };
    // First that the signature is the key's, over what it claims; then that the claim is this.
    let message = signed_message(signed, &signature.sha256, signature.min_version.as_ref());
    key.0.verify_strict(&message, &signature.sig).map_err(|_| mismatch())?;
    if sha256(module) != signature.sha256 {
        return Err(mismatch());
    }
    if signed != installing {
        return Err(SigningError::WrongIdentity { signed: signed.clone(), installing: installing.clone() });
    }
    Ok(Verified { key, legacy: false, min_version: signature.min_version.clone() })
}

/// The path of the detached signature of `module`: `MODULE.wasm.sig`.
pub fn signature_path(module: &Path) -> PathBuf {
    let mut s = module.as_os_str().to_owned();
    s.push(".sig");
    PathBuf::from(s)
}

/// Signs the module file at `module` as `identity` with the key file at `key` and writes the
/// detached signature next to it (`MODULE.wasm.sig`), revoking the versions of its name below
/// `min_version` when given ([`sign_revoking_below`]). Returns the signature's path.
pub fn sign_file(
    key: &Path,
    module: &Path,
    identity: &Identity,
    min_version: Option<&str>,
) -> Result<PathBuf, SigningError> {
    let key = SecretKey::read(key)?;
    let bytes = std::fs::read(module).map_err(|source| SigningError::Io { path: module.to_path_buf(), source })?;
    let signature = match min_version {
        Some(min) => sign_revoking_below(&key, &bytes, identity, min)?,
        None => sign(&key, &bytes, identity),
    };
    let path = signature_path(module);
    std::fs::write(&path, signature.to_text()).map_err(|source| SigningError::Io { path: path.clone(), source })?;
    Ok(path)
}

fn read_text(path: &Path) -> Result<String, SigningError> {
    std::fs::read_to_string(path).map_err(|source| SigningError::Io { path: path.to_path_buf(), source })
}

impl SecretKey {
    /// The public half, to configure as trusted on the nodes.
    pub fn public(&self) -> PublicKey {
        PublicKey(self.0.verifying_key())
    }

    /// The key file's text.
    pub fn to_text(&self) -> String {
        format!("{SECRET_TAG} {}\n", hex(self.0.as_bytes()))
    }

    /// Parses a key file's text.
    pub fn from_text(text: &str) -> Result<SecretKey, SigningError> {
        let bad = |reason| SigningError::BadKey { what: "secret key".into(), tag: SECRET_TAG, reason };
        let seed = unhex::<32>(tagged(text, SECRET_TAG).map_err(bad)?).map_err(bad)?;
        Ok(SecretKey(SigningKey::from_bytes(&seed)))
    }

    /// Reads a key file.
    pub fn read(path: &Path) -> Result<SecretKey, SigningError> {
        SecretKey::from_text(&read_text(path)?).map_err(|e| match e {
            SigningError::BadKey { tag, reason, .. } => {
                SigningError::BadKey { what: format!("secret key file {}", path.display()), tag, reason }
            }
            e => e,
        })
    }

    /// Writes the key file, readable by its owner only, and the public key next to it as
    /// `PATH.pub`. Refuses to overwrite an existing key.
    pub fn write(&self, path: &Path) -> Result<(), SigningError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| SigningError::Io { path, source }
        };
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(path).map_err(io(path))?;
        std::io::Write::write_all(&mut file, self.to_text().as_bytes()).map_err(io(path))?;
        let mut public = path.as_os_str().to_owned();
        public.push(".pub");
        let public = PathBuf::from(public);
        std::fs::write(&public, self.public().to_text()).map_err(io(&public))
    }
}

impl PublicKey {
    /// The public key's text: `timeshard-policy-public-key-v1 <hex>`.
    pub fn to_text(&self) -> String {
        format!("{PUBLIC_TAG} {self}\n")
    }

    /// Parses a public key, with or without its `timeshard-policy-public-key-v1` tag.
    pub fn from_text(text: &str) -> Result<PublicKey, SigningError> {
        let bad = |reason: String| SigningError::BadKey { what: "public key".into(), tag: PUBLIC_TAG, reason };
        let body = tagged(text, PUBLIC_TAG).or_else(|_| {
            let t = text.trim();
            if t.is_empty() { Err("the text is empty".to_string()) } else { Ok(t) }
        });
        let bytes = unhex::<32>(body.map_err(bad)?).map_err(bad)?;
        VerifyingKey::from_bytes(&bytes).map(PublicKey).map_err(|_| bad("not a valid ed25519 point".into()))
    }
}

impl Signature {
    /// The key that made the signature.
    pub fn key(&self) -> &PublicKey {
        &self.key
    }

    /// What the signature says the module is; `None` for the first format.
    pub fn identity(&self) -> Option<&Identity> {
        self.identity.as_ref()
    }

    /// The sha256 of the signed module.
    pub fn sha256(&self) -> &[u8; 32] {
        &self.sha256
    }

    /// The version below which the signature revokes its name's versions, if it carries one.
    pub fn min_version(&self) -> Option<&semver::Version> {
        self.min_version.as_ref()
    }

    /// The signature file's text.
    pub fn to_text(&self) -> String {
        let (sig, sha) = (hex(&self.sig.to_bytes()), hex(&self.sha256));
        match &self.identity {
            Some(id) => {
                let min = self.min_version.as_ref().map(|m| format!("min-version {m}\n")).unwrap_or_default();
                format!(
                    "{SIGNATURE_TAG}\nkey {}\nname {}\nversion {}\nkind {}\nsha256 {sha}\n{min}sig {sig}\n",
                    self.key, id.policy.name, id.policy.version, id.kind
                )
            }
            None => format!("{SIGNATURE_V1_TAG}\nkey {}\nsha256 {sha}\nsig {sig}\n", self.key),
        }
    }

    /// Parses a signature file's text (either format).
    pub fn from_text(text: &str) -> Result<Signature, SigningError> {
        let bad = SigningError::BadSignatureFile;
        let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#'));
        let v2 = match lines.next() {
            Some(SIGNATURE_TAG) => true,
            Some(SIGNATURE_V1_TAG) => false,
            _ => return Err(bad(format!("the first line is not `{SIGNATURE_TAG}`"))),
        };
        let (mut key, mut sha, mut sig) = (None, None, None);
        let (mut name, mut version, mut kind, mut min) = (None, None, None, None);
        for line in lines {
            let (field, value) =
                line.split_once(' ').ok_or_else(|| bad(format!("line {line:?} is not `field value`")))?;
            let value = value.trim();
            match field {
                "key" => key = Some(PublicKey::from_text(value).map_err(|e| bad(e.to_string()))?),
                "sha256" => sha = Some(unhex::<32>(value).map_err(|e| bad(format!("sha256: {e}")))?),
                "sig" => sig = Some(unhex::<64>(value).map_err(|e| bad(format!("sig: {e}")))?),
                "name" if v2 => name = Some(value.to_string()),
                "version" if v2 => version = Some(value.to_string()),
                "kind" if v2 => {
                    kind = Some(value.parse::<Kind>().map_err(|e| bad(format!("kind: {e}")))?);
                }
                "min-version" if v2 => min = Some(value.to_string()),
                other => return Err(bad(format!("unknown field {other:?}"))),
            }
        }
        let identity = if v2 {
            let missing = |f: &str| bad(format!("no `{f}` line"));
            let name = name.ok_or_else(|| missing("name"))?;
            let version = version.ok_or_else(|| missing("version"))?;
            let policy = PolicyRef::new(&name, &version).map_err(|e| bad(e.to_string()))?;
            Some(Identity { policy, kind: kind.ok_or_else(|| missing("kind"))? })
        } else {
            None
        };
        let min_version = match (&min, &identity) {
            (Some(m), Some(id)) => Some(check_minimum(m, &id.policy.version).map_err(|e| bad(e.to_string()))?),
            _ => None,
        };
        Ok(Signature {
            key: key.ok_or_else(|| bad("no `key` line".into()))?,
            identity,
            sha256: sha.ok_or_else(|| bad("no `sha256` line".into()))?,
            min_version,
            sig: ed25519_dalek::Signature::from_bytes(&sig.ok_or_else(|| bad("no `sig` line".into()))?),
        })
    }

    /// Reads a signature file.
    pub fn read(path: &Path) -> Result<Signature, SigningError> {
        Signature::from_text(&read_text(path)?)
    }
}

/// The policy keys a node trusts.
#[derive(Clone, Debug, Default)]
pub struct TrustedKeys(Vec<PublicKey>);

impl TrustedKeys {
    /// Trusts `keys`.
    pub fn new(keys: impl IntoIterator<Item = PublicKey>) -> TrustedKeys {
        TrustedKeys(keys.into_iter().collect())
    }

    /// Parses public keys as written in node configuration.
    pub fn from_texts<'a>(texts: impl IntoIterator<Item = &'a str>) -> Result<TrustedKeys, SigningError> {
        texts.into_iter().map(PublicKey::from_text).collect::<Result<_, _>>().map(TrustedKeys)
    }

    /// The trusted keys.
    pub fn keys(&self) -> &[PublicKey] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str, version: &str, kind: Kind) -> Identity {
        Identity::new(PolicyRef::new(name, version).unwrap(), kind)
    }

    #[test]
    fn text_formats_round_trip() {
        let key = generate_keypair().unwrap();
        let again = SecretKey::from_text(&key.to_text()).unwrap();
        assert_eq!(again.public(), key.public());
        assert_eq!(PublicKey::from_text(&key.public().to_text()).unwrap(), key.public());
        // Bare hex works in configuration too.
        assert_eq!(PublicKey::from_text(&key.public().to_string()).unwrap(), key.public());
        let sig = sign(&key, b"module bytes", &id("rms", "1.0.0", Kind::Query));
        assert_eq!(Signature::from_text(&sig.to_text()).unwrap(), sig);
        assert!(sig.to_text().contains("\nname rms\nversion 1.0.0\nkind query\n"), "{}", sig.to_text());
        let old = sign_v1(&key, b"module bytes");
        assert_eq!(Signature::from_text(&old.to_text()).unwrap(), old);
        assert!(old.to_text().starts_with(SIGNATURE_V1_TAG));
    }

    /// Found by fuzzing (fuzz/regressions/policy_signature): hex of the right byte length
    /// holding a multi-byte character was sliced through the character, and the node panicked
    /// reading a key or signature file.
    #[test]
    fn non_ascii_hex_is_an_error_not_a_panic() {
        let lossy = String::from_utf8_lossy(
            b"t\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
        )
        .into_owned();
        assert!(PublicKey::from_text(&lossy).is_err());
        assert!(Signature::from_text(&lossy).is_err());
        // 64 bytes of text, 32 characters: a key's length in bytes, not in digits.
        let wide = "é".repeat(32);
        let err = PublicKey::from_text(&wide).unwrap_err().to_string();
        assert!(err.contains("hex"), "{err}");
    }

    #[test]
    fn verify_refuses_wrong_key_and_changed_bytes() {
        let (a, b) = (generate_keypair().unwrap(), generate_keypair().unwrap());
        let trusted = TrustedKeys::new([a.public()]);
        let me = id("pmu-validate", "1.0.0", Kind::Ingest);
        let sig = sign(&a, b"module bytes", &me);
        assert_eq!(verify(&trusted, b"module bytes", &me, &sig, false).unwrap().key, &a.public());
        assert!(matches!(verify(&trusted, b"module bytez", &me, &sig, false), Err(SigningError::Mismatch { .. })));
        assert!(matches!(
            verify(&trusted, b"module bytes", &me, &sign(&b, b"module bytes", &me), false),
            Err(SigningError::Untrusted { .. })
        ));
        // A forged claim: the identity lines changed after signing.
        let forged = sig.to_text().replace("name pmu-validate", "name other");
        let forged = Signature::from_text(&forged).unwrap();
        let other = id("other", "1.0.0", Kind::Ingest);
        assert!(matches!(
            verify(&trusted, b"module bytes", &other, &forged, false),
            Err(SigningError::Mismatch { .. })
        ));
    }

    #[test]
    fn a_signature_binds_name_version_and_kind() {
        let key = generate_keypair().unwrap();
        let trusted = TrustedKeys::new([key.public()]);
        let noop = id("noop", "1.0.0", Kind::Query);
        let sig = sign(&key, b"noop bytes", &noop);
        verify(&trusted, b"noop bytes", &noop, &sig, false).unwrap();
        for installing in [
            id("pmu-validate", "1.0.0", Kind::Query),
            id("noop", "1.0.1", Kind::Query),
            id("noop", "1.0.0", Kind::Ingest),
        ] {
            match verify(&trusted, b"noop bytes", &installing, &sig, false) {
                Err(e @ SigningError::WrongIdentity { .. }) => {
                    let text = e.to_string();
                    assert!(text.contains("noop@1.0.0 (query policy)"), "{text}");
                    assert!(text.contains(&installing.to_string()), "{text}");
                }
                other => panic!("{installing} accepted: {other:?}"),
            }
        }
    }

    #[test]
    fn a_minimum_version_is_signed_and_cannot_be_stripped_or_raised() {
        let key = generate_keypair().unwrap();
        let trusted = TrustedKeys::new([key.public()]);
        let me = id("pmu-validate", "1.3.0", Kind::Ingest);
        let sig = sign_revoking_below(&key, b"v1.3 bytes", &me, "1.3.0").unwrap();
        let text = sig.to_text();
        assert!(text.contains("\nmin-version 1.3.0\n"), "{text}");
        assert_eq!(Signature::from_text(&text).unwrap(), sig);
        let ok = verify(&trusted, b"v1.3 bytes", &me, &sig, false).unwrap();
        assert_eq!(ok.min_version, Some(semver::Version::new(1, 3, 0)));
        // Taking the line out, or changing it, breaks the signature.
        let stripped = Signature::from_text(&text.replace("min-version 1.3.0\n", "")).unwrap();
        assert!(matches!(verify(&trusted, b"v1.3 bytes", &me, &stripped, false), Err(SigningError::Mismatch { .. })));
        let lowered = Signature::from_text(&text.replace("min-version 1.3.0", "min-version 1.0.0")).unwrap();
        assert!(matches!(verify(&trusted, b"v1.3 bytes", &me, &lowered, false), Err(SigningError::Mismatch { .. })));
        // A minimum above the version signed, or not a semantic version, is refused.
        for (min, version) in [("1.4.0", "1.3.0"), ("latest", "1.3.0"), ("1.0.0", "v1")] {
            let err = sign_revoking_below(&key, b"x", &id("p", version, Kind::Ingest), min).unwrap_err();
            assert!(matches!(err, SigningError::BadMinimum { .. }), "{min} with {version}: {err}");
        }
        let above = text.replace("min-version 1.3.0", "min-version 2.0.0");
        assert!(Signature::from_text(&above).unwrap_err().to_string().contains("minimum version"));
    }

    #[test]
    fn old_signatures_only_when_allowed() {
        let key = generate_keypair().unwrap();
        let trusted = TrustedKeys::new([key.public()]);
        let me = id("rms", "1.0.0", Kind::Query);
        let old = sign_v1(&key, b"rms bytes");
        assert!(matches!(verify(&trusted, b"rms bytes", &me, &old, false), Err(SigningError::Legacy)));
        let ok = verify(&trusted, b"rms bytes", &me, &old, true).unwrap();
        assert!(ok.legacy);
        assert!(matches!(verify(&trusted, b"rms bytez", &me, &old, true), Err(SigningError::Mismatch { .. })));
    }

    #[test]
    fn malformed_texts_are_refused_with_the_expected_form() {
        let e = SecretKey::from_text("hello").unwrap_err().to_string();
        assert!(e.contains(SECRET_TAG), "{e}");
        assert!(PublicKey::from_text("abcd").is_err());
        assert!(Signature::from_text("timeshard-policy-signature-v2\nkey 00\n").is_err());
        assert!(Signature::from_text("").is_err());
        let key = generate_keypair().unwrap();
        let text = sign(&key, b"m", &id("a", "1", Kind::Ingest)).to_text();
        let e = Signature::from_text(&text.replace("kind ingest", "kind other")).unwrap_err().to_string();
        assert!(e.contains("ingest or query"), "{e}");
        assert!(Signature::from_text(&text.replace("name a\n", "")).unwrap_err().to_string().contains("`name`"));
    }

    #[test]
    fn key_files_are_written_once_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.key");
        let key = generate_keypair().unwrap();
        key.write(&path).unwrap();
        assert!(key.write(&path).is_err(), "an existing key is not overwritten");
        assert_eq!(SecretKey::read(&path).unwrap().public(), key.public());
        let public = std::fs::read_to_string(dir.path().join("policy.key.pub")).unwrap();
        assert_eq!(PublicKey::from_text(&public).unwrap(), key.public());

        let module = dir.path().join("m.wasm");
        std::fs::write(&module, b"\0asm bytes").unwrap();
        let me = id("m", "0.1.0", Kind::Ingest);
        let sig_path = sign_file(&path, &module, &me, None).unwrap();
        assert_eq!(sig_path, dir.path().join("m.wasm.sig"));
        let sig = Signature::read(&sig_path).unwrap();
        verify(&TrustedKeys::new([key.public()]), b"\0asm bytes", &me, &sig, false).unwrap();
    }
}
