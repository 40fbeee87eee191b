//! The control plane under simulation. Every simulated node is enrolled and runs the real
//! follower (`timeshard_node::control`): it long-polls its desired state, applies each new
//! generation (classes, its location) without a restart, records it on disk before it is in
//! force, and reports what it runs. What stands in for the cloud is this module: the fleet's
//! desired state (one generation for the whole fleet, each device's location) kept by the
//! simulator, answered through the agent's transport seam ([`Exchange`]) the way the HTTPS API
//! answers (`304` when nothing changed within the wait, the state as JSON when something did),
//! with a WAN's latency, and cut off when the plan says the cloud is unreachable.
//!
//! Device locations change here, as an operator's `timeshard-control device set-location`
//! changes them, and reach each node only when its follower gets through: late after an
//! outage, or after the node restarts from the generation it applied last.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use http::{Method, StatusCode};
use timeshard_control_api::api::{ErrorBody, Report, paths};
use timeshard_control_api::files::{self, EnrollmentRecord, NewEnrollment};
use timeshard_control_api::http::{Answer, Exchange, ExchangeFuture, HttpError};
use timeshard_control_api::{ClassSpec, DesiredState, Fingerprint, FleetState, Location};
use timeshard_proto::geo::GeoPoint;
use timeshard_sdk::tls::TlsFiles;

/// The control plane's address as nodes record it (nothing listens there).
pub const URL: &str = "https://control.sim:7443";
/// One way between a device and the cloud.
const ONE_WAY: Duration = Duration::from_millis(30);
/// How long a call to the unreachable cloud takes to fail.
const UNREACHABLE_AFTER: Duration = Duration::from_secs(1);
/// How often a long-polled watch looks for a new generation.
const WATCH_POLL: Duration = Duration::from_millis(250);

/// The fleet's desired state and what the nodes reported.
#[derive(Debug)]
pub struct ControlPlane {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    fleet: FleetState,
    /// Each device's location, by node id.
    locations: BTreeMap<String, Option<Location>>,
    reachable: bool,
    /// The generation each node last reported running.
    reported: BTreeMap<String, u64>,
}

impl ControlPlane {
    /// A control plane at generation 1 running `classes`.
    pub fn new(classes: Vec<ClassSpec>) -> Arc<ControlPlane> {
        let fleet = FleetState::new(1, classes, Vec::new(), Vec::new());
        Arc::new(ControlPlane {
            inner: Mutex::new(Inner { fleet, locations: BTreeMap::new(), reachable: true, reported: BTreeMap::new() }),
        })
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Enrolls the device whose certificate is `tls` at `location`: writes what enrollment
    /// writes into `<data_dir>/control` (its key and certificate, the fleet CA, the desired
    /// state of now). Returns its node id.
    pub fn enroll(&self, data_dir: &Path, tls: &TlsFiles, location: Option<GeoPoint>) -> Result<String> {
        let read = |p: &Path| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
        let (ca_pem, cert_pem, key_pem) = (read(&tls.ca)?, read(&tls.cert)?, read(&tls.key)?);
        let key = rcgen::KeyPair::from_pem(&key_pem).context("the node key")?;
        let node_id = timeshard_control_api::agent::node_id_of(&key);
        let ca_der = rustls_pki_types::pem::PemObject::from_pem_slice(ca_pem.as_bytes())
            .map(|c: rustls_pki_types::CertificateDer<'static>| c.to_vec())
            .context("the fleet CA")?;
        let fleet = Fingerprint::of_certificate(&ca_der).context("the fleet CA's fingerprint")?;
        let desired = {
            let mut inner = self.inner();
            inner.locations.insert(node_id.clone(), location.map(location_of));
            inner.desired(&node_id)
        };
        let record =
            EnrollmentRecord { url: URL.into(), fleet: fleet.to_string(), node_id: node_id.clone(), enrolled_at_ms: 0 };
        files::write_new(
            data_dir,
            &NewEnrollment {
                record: &record,
                ca_pem: &ca_pem,
                cert_pem: &cert_pem,
                key_pem: &key_pem,
                desired: &desired,
            },
        )?;
        Ok(node_id)
    }

    /// Moves devices (`None`: clears the location), all in one new generation.
    pub fn set_locations(&self, moves: &[(String, Option<GeoPoint>)]) {
        if moves.is_empty() {
            return;
        }
        let mut inner = self.inner();
        for (node_id, to) in moves {
            inner.locations.insert(node_id.clone(), to.map(location_of));
        }
        inner.fleet.generation += 1;
    }

    /// Cuts the cloud off from every device, or brings it back.
    pub fn set_reachable(&self, reachable: bool) {
        self.inner().reachable = reachable;
    }

    /// The generation the fleet should run.
    pub fn generation(&self) -> u64 {
        self.inner().fleet.generation
    }

    /// The generation `node_id` last reported running (0 before its first report).
    pub fn reported(&self, node_id: &str) -> u64 {
        self.inner().reported.get(node_id).copied().unwrap_or(0)
    }

    /// The way device `node_id` reaches this control plane (its follower's transport).
    pub fn link(self: &Arc<Self>, node_id: String) -> Arc<dyn Exchange> {
        Arc::new(Link { control: self.clone(), node_id })
    }
}

impl Inner {
    fn desired(&self, node_id: &str) -> DesiredState {
        let location = self.locations.get(node_id).cloned().flatten();
        self.fleet.for_node(node_id, &BTreeMap::new(), location.as_ref())
    }
}

fn location_of(p: GeoPoint) -> Location {
    Location::new(p.lat, p.lon).expect("a simulated location is a valid one")
}

/// One device's connection to the control plane.
struct Link {
    control: Arc<ControlPlane>,
    node_id: String,
}

impl Exchange for Link {
    fn call<'a>(&'a self, method: Method, path: &'a str, body: Option<Vec<u8>>) -> ExchangeFuture<'a> {
        Box::pin(async move {
            tokio::time::sleep(ONE_WAY).await;
            if !self.control.inner().reachable {
                tokio::time::sleep(UNREACHABLE_AFTER).await;
                return Err(unreachable());
            }
            let (route, query) = path.split_once('?').unwrap_or((path, ""));
            let answer = match (method, route) {
                (Method::GET, paths::WATCH) => self.watch(query).await?,
                (Method::POST, paths::REPORT) => self.report(body.as_deref().unwrap_or_default()),
                (method, route) => refusal(StatusCode::NOT_FOUND, "not_found", &format!("no {method} {route} here")),
            };
            tokio::time::sleep(ONE_WAY).await;
            Ok(answer)
        })
    }
}

fn unreachable() -> HttpError {
    HttpError::Connect { addr: "control.sim:7443".into(), reason: "the simulated cloud is cut off".into() }
}

fn refusal(status: StatusCode, code: &str, message: &str) -> Answer {
    let body = ErrorBody { error: message.into(), code: code.into() };
    Answer { status, body: Bytes::from(serde_json::to_vec(&body).expect("an error body serializes")) }
}

impl Link {
    /// `GET /v1/node/watch?since=G&wait_ms=W`: the state as soon as the fleet passes
    /// generation G, or `304` after W.
    async fn watch(&self, query: &str) -> Result<Answer, HttpError> {
        let param =
            |name: &str| query.split('&').find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse::<u64>().ok());
        let (Some(since), Some(wait_ms)) = (param("since"), param("wait_ms")) else {
            return Ok(refusal(StatusCode::BAD_REQUEST, "bad_request", "since and wait_ms are required"));
        };
        let until = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
        loop {
            {
                let inner = self.control.inner();
                if !inner.reachable {
                    return Err(HttpError::Transport {
                        addr: "control.sim:7443".into(),
                        reason: "the connection broke: the simulated cloud is cut off".into(),
                    });
                }
                if inner.fleet.generation > since {
                    let state = inner.desired(&self.node_id);
                    let body = serde_json::to_vec(&state).expect("a desired state serializes");
                    return Ok(Answer { status: StatusCode::OK, body: Bytes::from(body) });
                }
            }
            if tokio::time::Instant::now() >= until {
                return Ok(Answer { status: StatusCode::NOT_MODIFIED, body: Bytes::new() });
            }
            tokio::time::sleep(WATCH_POLL).await;
        }
    }

    /// `POST /v1/node/report`: remembers the generation the node runs.
    fn report(&self, body: &[u8]) -> Answer {
        match serde_json::from_slice::<Report>(body) {
            Ok(report) => {
                self.control.inner().reported.insert(self.node_id.clone(), report.generation_applied);
                Answer { status: StatusCode::NO_CONTENT, body: Bytes::new() }
            }
            Err(e) => refusal(StatusCode::BAD_REQUEST, "bad_request", &format!("the report does not parse: {e}")),
        }
    }
}
