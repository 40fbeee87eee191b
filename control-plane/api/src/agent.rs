//! The device side: enroll with a one-time token, then renew the certificate, watch desired
//! state and report what the node runs. The node drives these calls; this module does not
//! decide when (except [`NodeClient::renewal_due`]) and applies nothing itself.
//!
//! The node's loop (`timeshard_node::control`), in short:
//! ```text
//! agent = if enrolled { Agent::open(dir) } else { agent::enroll(url, token, dir) }
//! start from agent.applied()
//! loop {
//!     if agent.client().renewal_due(now) { agent.renew() }
//!     match agent.client().watch(applied.generation, 30 s) {
//!         Some(new) => apply it; on success agent.save_applied(new) and report; on failure report
//!                      the error and keep the old state
//!         None => report periodically (heartbeat)
//!     }
//! }
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::Method;
use rcgen::{CertificateParams, DnType, KeyPair, PublicKeyData};
use timeshard_proto::Id;

use crate::api::{EnrollRequest, EnrollResponse, Issued, RenewRequest, Report, paths};
use crate::files::{self, EnrollmentRecord, FileError, NewEnrollment};
use crate::http::{CALL_TIMEOUT, Endpoint, Exchange, HttpError};
use crate::state::{DesiredState, STATE_FORMAT};
use crate::tls::{self, TlsError};
use crate::token::{Fingerprint, Token, TokenError, TokenKind};

/// Enrolling, renewing, watching or reporting failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("cannot make the node key or its certificate request: {0}")]
    Key(String),
    #[error("the control plane's answer does not fit the request: {0}")]
    BadAnswer(String),
    #[error(
        "{dir} already holds an enrollment (node {node_id}); start without --enroll to use it, \
         or remove {dir} to enroll again with a new key"
    )]
    AlreadyEnrolled { dir: PathBuf, node_id: String },
    #[error(
        "{dir} holds no enrollment; enroll first with \
         `timeshard node --enroll https://HOST:PORT --token TOKEN --data-dir DATA_DIR`"
    )]
    NotEnrolled { dir: PathBuf },
    #[error("enrollment files: {0}")]
    Files(#[from] FileError),
    /// The control plane sent a desired state this node cannot understand; report it.
    #[error("desired state generation {generation} cannot be applied by this node: {reason}")]
    Incompatible { generation: u64, reason: String },
}

impl AgentError {
    /// Whether the control plane refused because this node's certificate is revoked.
    pub fn is_revoked(&self) -> bool {
        matches!(self, AgentError::Http(e) if e.code() == Some("revoked"))
    }

    /// Whether the control plane could not be reached or could not answer for now (no
    /// connection, a timeout, a cut transfer, or a 5xx): worth trying again later. A refusal
    /// (a used or unknown token, a revoked node), a wrong server (TLS) or a bad answer is not.
    pub fn is_unreachable(&self) -> bool {
        match self {
            AgentError::Http(HttpError::Connect { .. } | HttpError::Timeout { .. } | HttpError::Transport { .. }) => {
                true
            }
            AgentError::Http(HttpError::Api { status, .. }) => *status >= 500,
            _ => false,
        }
    }
}

/// What identifies an enrolled node to the control plane. `Debug` hides the key.
#[derive(Clone)]
pub struct Credentials {
    pub url: String,
    pub fleet: Fingerprint,
    pub node_id: String,
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("url", &self.url).field("node_id", &self.node_id).finish()
    }
}

/// The result of enrolling, before anything is written.
#[derive(Debug, Clone)]
pub struct Enrolled {
    pub credentials: Credentials,
    pub desired: DesiredState,
}

/// The node id of a key: SHA-1 of its SubjectPublicKeyInfo, as `timeshard_sdk` derives it.
pub fn node_id_of(key: &KeyPair) -> String {
    Id::of_public_key(&key.subject_public_key_info()).to_hex()
}

fn csr_pem(key: &KeyPair) -> Result<String, AgentError> {
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, "timeshard node");
    let csr = params.serialize_request(key).map_err(|e| AgentError::Key(e.to_string()))?;
    csr.pem().map_err(|e| AgentError::Key(e.to_string()))
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Checks that `issued` is a certificate for `node_id` from the fleet `fleet`.
fn check_issued(issued: &Issued, node_id: &str, fleet: Fingerprint) -> Result<(), AgentError> {
    let ca = tls::certs_from_pem("the fleet CA", &issued.ca_pem)?;
    if Fingerprint::of_certificate(&ca[0])? != fleet {
        return Err(AgentError::BadAnswer("the CA it sent is not the one the token names".into()));
    }
    let cert = tls::certs_from_pem("the node certificate", &issued.certificate_pem)?;
    let (_, parsed) = x509_parser::parse_x509_certificate(&cert[0])
        .map_err(|e| AgentError::BadAnswer(format!("the certificate does not parse: {e}")))?;
    if Id::of_public_key(parsed.public_key().raw).to_hex() != node_id || issued.node_id != node_id {
        return Err(AgentError::BadAnswer("the certificate is not for this node's key".into()));
    }
    Ok(())
}

/// Enrolls with `token` at the control plane `url`: makes a key, sends a CSR, and returns the
/// certificate and initial desired state. Writes nothing ([`enroll`] does).
pub async fn request_enrollment(url: &str, token: &str) -> Result<Enrolled, AgentError> {
    let token = Token::parse(token, TokenKind::Enrollment)?;
    let key = KeyPair::generate().map_err(|e| AgentError::Key(e.to_string()))?;
    let node_id = node_id_of(&key);
    let endpoint = Endpoint::new(url, tls::pinned_config(token.fleet)?)?;
    let request = EnrollRequest { token: token.to_string(), csr_pem: csr_pem(&key)? };
    let answer: EnrollResponse = endpoint.send(Method::POST, paths::ENROLL, None, &request).await?;
    check_issued(&answer.issued, &node_id, token.fleet)?;
    if answer.desired.node_id != node_id {
        return Err(AgentError::BadAnswer("the desired state is for another node".into()));
    }
    let credentials = Credentials {
        url: url.trim().to_string(),
        fleet: token.fleet,
        node_id,
        ca_pem: answer.issued.ca_pem,
        cert_pem: answer.issued.certificate_pem,
        key_pem: key.serialize_pem(),
    };
    Ok(Enrolled { credentials, desired: answer.desired })
}

/// Enrolls and stores everything in `<data_dir>/control` (see [`files`]). Refuses when the
/// data directory already holds an enrollment.
pub async fn enroll(url: &str, token: &str, data_dir: &Path) -> Result<Agent, AgentError> {
    let dir = data_dir.join(files::CONTROL_DIR);
    if let Ok(record) = files::read_json::<EnrollmentRecord>(&dir.join(files::ENROLLMENT_FILE)) {
        return Err(AgentError::AlreadyEnrolled { dir, node_id: record.node_id });
    }
    let enrolled = request_enrollment(url, token).await?;
    let c = &enrolled.credentials;
    let record = EnrollmentRecord {
        url: c.url.clone(),
        fleet: c.fleet.to_string(),
        node_id: c.node_id.clone(),
        enrolled_at_ms: now_ms(),
    };
    files::write_new(
        data_dir,
        &NewEnrollment {
            record: &record,
            ca_pem: &c.ca_pem,
            cert_pem: &c.cert_pem,
            key_pem: &c.key_pem,
            desired: &enrolled.desired,
        },
    )?;
    Agent::open(data_dir)
}

/// An enrolled node's connection to the control plane (mutual TLS with its certificate).
#[derive(Debug, Clone)]
pub struct NodeClient {
    credentials: Credentials,
    endpoint: Endpoint,
    not_before: SystemTime,
    not_after: SystemTime,
}

impl NodeClient {
    /// A client presenting `credentials`.
    pub fn new(credentials: Credentials) -> Result<NodeClient, AgentError> {
        NodeClient::through(credentials, None)
    }

    /// [`NodeClient::new`], its calls made through `exchange` when there is one (a simulation).
    pub fn through(credentials: Credentials, exchange: Option<Arc<dyn Exchange>>) -> Result<NodeClient, AgentError> {
        let config = tls::node_config(&credentials.ca_pem, &credentials.cert_pem, &credentials.key_pem)?;
        let endpoint = Endpoint::new(&credentials.url, config)?.through(exchange);
        let (not_before, not_after) = validity(&credentials.cert_pem)?;
        Ok(NodeClient { credentials, endpoint, not_before, not_after })
    }

    pub fn credentials(&self) -> &Credentials {
        &self.credentials
    }

    pub fn node_id(&self) -> &str {
        &self.credentials.node_id
    }

    /// When the certificate expires.
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// Whether two thirds of the certificate's lifetime have passed (about 2 days before expiry
    /// with the default 7 days), so renewal has a third of it to succeed.
    pub fn renewal_due(&self, now: SystemTime) -> bool {
        let life = self.not_after.duration_since(self.not_before).unwrap_or_default();
        now >= self.not_before + life * 2 / 3
    }

    /// Gets a fresh certificate for the same key (the node id stays). Returns the new
    /// credentials' certificate; the client uses it from now on.
    pub async fn renew(&mut self) -> Result<Issued, AgentError> {
        let key =
            KeyPair::from_pem(&self.credentials.key_pem).map_err(|e| AgentError::Key(format!("node.key: {e}")))?;
        let request = RenewRequest { csr_pem: csr_pem(&key)? };
        let issued: Issued = self.endpoint.send(Method::POST, paths::RENEW, None, &request).await?;
        check_issued(&issued, &self.credentials.node_id, self.credentials.fleet)?;
        let mut credentials = self.credentials.clone();
        credentials.cert_pem = issued.certificate_pem.clone();
        credentials.ca_pem = issued.ca_pem.clone();
        *self = NodeClient::through(credentials, self.endpoint.exchange())?;
        Ok(issued)
    }

    /// Waits up to `wait` for a desired state newer than generation `since`; `None` when
    /// nothing changed in that time.
    pub async fn watch(&self, since: u64, wait: Duration) -> Result<Option<DesiredState>, AgentError> {
        let wait_ms = wait.as_millis().min(u128::from(crate::api::MAX_WATCH_WAIT_MS)) as u64;
        let path = format!("{}?since={since}&wait_ms={wait_ms}", paths::WATCH);
        let answer =
            self.endpoint.call(Method::GET, &path, None, None, Duration::from_millis(wait_ms) + CALL_TIMEOUT).await?;
        if answer.status == http::StatusCode::NOT_MODIFIED {
            return Ok(None);
        }
        let value: serde_json::Value = answer.json()?;
        let state = decode_state(value)?;
        if state.node_id != self.credentials.node_id {
            return Err(AgentError::BadAnswer("the desired state is for another node".into()));
        }
        Ok(Some(state))
    }

    /// Fetches the policy module whose SHA-256 is `sha256` (hex), checked against it.
    pub async fn fetch_module(&self, sha256: &str) -> Result<Vec<u8>, AgentError> {
        let path = format!("{}/{sha256}", crate::api::paths::MODULES);
        let answer = self.endpoint.call(Method::GET, &path, None, None, CALL_TIMEOUT).await?;
        answer.check()?;
        let got = crate::token::hex(&crate::token::sha256(&answer.body));
        if got != sha256 {
            return Err(AgentError::BadAnswer(format!("module {sha256} arrived with the hash {got}")));
        }
        Ok(answer.body.to_vec())
    }

    /// Tells the control plane what the node runs and how it is.
    pub async fn report(&self, report: &Report) -> Result<(), AgentError> {
        let body = serde_json::to_vec(report).map_err(|e| AgentError::Key(e.to_string()))?;
        self.endpoint.call(Method::POST, paths::REPORT, None, Some(body), CALL_TIMEOUT).await?.check()?;
        Ok(())
    }
}

/// A desired state from JSON, or [`AgentError::Incompatible`] naming its generation when this
/// version cannot read it (a newer format, fields it does not know).
pub fn decode_state(value: serde_json::Value) -> Result<DesiredState, AgentError> {
    let generation = value.get("generation").and_then(|g| g.as_u64()).unwrap_or(0);
    let format = value.get("format").and_then(|f| f.as_u64()).unwrap_or(0);
    if format > u64::from(STATE_FORMAT) {
        return Err(AgentError::Incompatible {
            generation,
            reason: format!("it is format {format}, this node reads up to {STATE_FORMAT}; upgrade the node"),
        });
    }
    serde_json::from_value(value).map_err(|e| AgentError::Incompatible { generation, reason: e.to_string() })
}

fn validity(cert_pem: &str) -> Result<(SystemTime, SystemTime), AgentError> {
    let cert = tls::certs_from_pem("the node certificate", cert_pem)?;
    let (_, parsed) = x509_parser::parse_x509_certificate(&cert[0])
        .map_err(|e| AgentError::BadAnswer(format!("the certificate does not parse: {e}")))?;
    let at = |secs: i64| UNIX_EPOCH + Duration::from_secs(secs.max(0) as u64);
    Ok((at(parsed.validity().not_before.timestamp()), at(parsed.validity().not_after.timestamp())))
}

/// An enrolled node with its files: the client plus the last applied desired state.
#[derive(Debug)]
pub struct Agent {
    dir: PathBuf,
    client: NodeClient,
    applied: DesiredState,
}

impl Agent {
    /// Whether `data_dir` holds an enrollment.
    pub fn is_enrolled(data_dir: &Path) -> bool {
        data_dir.join(files::CONTROL_DIR).join(files::ENROLLMENT_FILE).exists()
    }

    /// Loads the enrollment in `data_dir`. Needs no network: a node restarted while the control
    /// plane is away starts from [`Agent::applied`].
    pub fn open(data_dir: &Path) -> Result<Agent, AgentError> {
        Agent::open_through(data_dir, None)
    }

    /// [`Agent::open`], reaching the control plane through `exchange` when there is one (a
    /// simulation) instead of the network.
    pub fn open_through(data_dir: &Path, exchange: Option<Arc<dyn Exchange>>) -> Result<Agent, AgentError> {
        let dir = data_dir.join(files::CONTROL_DIR);
        if !Agent::is_enrolled(data_dir) {
            return Err(AgentError::NotEnrolled { dir: data_dir.to_path_buf() });
        }
        let record: EnrollmentRecord = files::read_json(&dir.join(files::ENROLLMENT_FILE))?;
        let credentials = Credentials {
            url: record.url,
            fleet: record.fleet.parse()?,
            node_id: record.node_id,
            ca_pem: files::read(&dir.join(files::CA_FILE))?,
            cert_pem: files::read(&dir.join(files::CERT_FILE))?,
            key_pem: files::read(&dir.join(files::KEY_FILE))?,
        };
        let applied = decode_state(files::read_json(&dir.join(files::DESIRED_FILE))?)?;
        Ok(Agent { dir, client: NodeClient::through(credentials, exchange)?, applied })
    }

    /// `<data_dir>/control`: holds `ca.pem`, `node.pem` and `node.key` for the node's TLS.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn client(&self) -> &NodeClient {
        &self.client
    }

    pub fn node_id(&self) -> &str {
        self.client.node_id()
    }

    /// The last desired state the node applied (at first, the one enrollment returned).
    pub fn applied(&self) -> &DesiredState {
        &self.applied
    }

    /// Records that the node now runs `state`; written atomically before it is returned.
    pub fn save_applied(&mut self, state: DesiredState) -> Result<(), AgentError> {
        let bytes = serde_json::to_vec_pretty(&state).map_err(|e| AgentError::BadAnswer(e.to_string()))?;
        files::write_atomic(&self.dir.join(files::DESIRED_FILE), &bytes, false)?;
        self.applied = state;
        Ok(())
    }

    /// Renews the certificate and stores it (`node.pem`, `ca.pem`) atomically. The running
    /// node reloads its TLS identity from those files.
    pub async fn renew(&mut self) -> Result<Issued, AgentError> {
        let mut client = self.client.clone();
        let issued = client.renew().await?;
        files::write_atomic(&self.dir.join(files::CA_FILE), issued.ca_pem.as_bytes(), false)?;
        files::write_atomic(&self.dir.join(files::CERT_FILE), issued.certificate_pem.as_bytes(), false)?;
        self.client = client;
        Ok(issued)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::class::ClassSpec;
    use crate::state::FleetState;

    fn state() -> DesiredState {
        FleetState::new(4, vec![ClassSpec::new("pmu", "pmu.")], vec![], vec![]).for_node("n", &Default::default(), None)
    }

    #[test]
    fn newer_or_unknown_state_is_refused_with_its_generation() {
        let good = serde_json::to_value(state()).unwrap();
        assert_eq!(decode_state(good.clone()).unwrap(), state());
        let mut newer = good.clone();
        newer["format"] = (STATE_FORMAT + 1).into();
        let err = decode_state(newer).unwrap_err();
        assert!(matches!(err, AgentError::Incompatible { generation: 4, .. }), "{err}");
        assert!(err.to_string().contains("upgrade the node"), "{err}");
        let mut unknown = good;
        unknown["classes"][0]["in_coi_dist"] = 5.into();
        let err = decode_state(unknown).unwrap_err();
        assert!(matches!(err, AgentError::Incompatible { generation: 4, .. }), "{err}");
    }

    #[test]
    fn missing_enrollment_is_explained_and_files_are_written_privately() {
        let dir = tempfile::tempdir().unwrap();
        let err = Agent::open(dir.path()).unwrap_err();
        assert!(err.to_string().contains("timeshard node --enroll"), "{err}");
        let target = dir.path().join("x.json");
        files::write_atomic(&target, b"{}", true).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&target).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(!dir.path().join(".x.json.tmp").exists());
    }
}
