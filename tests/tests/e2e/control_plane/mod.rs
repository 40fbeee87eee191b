//! The control plane's own suite, on real `timeshard-control serve` processes: every scenario
//! on SQLite (one `serve` with its data directory, [`sqlite`]) and on PostgreSQL (two `serve`
//! instances sharing one throwaway server, [`postgres`]); devices are simulated with the api
//! crate's agent.

#![allow(dead_code)]

mod hostile;
pub mod locations;
pub mod policies;
mod postgres;
pub mod scenarios;
mod sqlite;

use std::path::PathBuf;
use std::time::Duration;

use http::Method;
use timeshard_control::cli::client::{Client, Connection};
use timeshard_control_api::agent::{self, Agent, AgentError};
use timeshard_control_api::api::{CreateEnrollmentToken, FleetInfo, TokenCreated, paths};
use timeshard_control_api::http::HttpError;
use timeshard_control_api::state::parse_labels;
use timeshard_testkit::control::postgres::ThrowawayPostgres;
use timeshard_testkit::control::process::{ServeProcess, Storage};

pub const EXE: &str = crate::CONTROL;

/// The control plane under test.
pub struct TestFleet {
    pub services: Vec<ServeProcess>,
    storage: Storage,
    instances: usize,
    pub admin_token: String,
    pub admin: Client,
    pub work: tempfile::TempDir,
    _pg: Option<ThrowawayPostgres>,
}

impl TestFleet {
    /// One service on SQLite.
    pub async fn sqlite() -> TestFleet {
        TestFleet::sqlite_with(&[]).await
    }

    /// One service on SQLite, started with `extra` arguments to `serve`.
    pub async fn sqlite_with(extra: &[&str]) -> TestFleet {
        let work = tempfile::tempdir().unwrap();
        let storage = Storage::Sqlite(work.path().join("control-data"));
        TestFleet::start(storage, 1, work, None, extra).await
    }

    /// Two services sharing one PostgreSQL database.
    pub async fn postgres() -> TestFleet {
        let pg = ThrowawayPostgres::start(false).expect("a throwaway PostgreSQL server");
        let url = pg.create_database("timeshard").unwrap();
        TestFleet::start(Storage::Postgres(url), 2, tempfile::tempdir().unwrap(), Some(pg), &[]).await
    }

    async fn start(
        storage: Storage,
        instances: usize,
        work: tempfile::TempDir,
        pg: Option<ThrowawayPostgres>,
        extra: &[&str],
    ) -> TestFleet {
        let first = ServeProcess::start(EXE.as_ref(), &storage, true, extra).await.unwrap();
        let admin_token = first.admin_token.clone().unwrap();
        let mut services = vec![first];
        for _ in 1..instances {
            services.push(ServeProcess::start(EXE.as_ref(), &storage, false, &[]).await.unwrap());
        }
        let admin = admin_client(&services[0].url, &admin_token);
        TestFleet { services, storage, instances, admin_token, admin, work, _pg: pg }
    }

    /// Which database, for messages.
    pub fn backend(&self) -> &'static str {
        match self.storage {
            Storage::Sqlite(_) => "SQLite",
            Storage::Postgres(_) => "PostgreSQL",
        }
    }

    /// Address of instance `i` (modulo the number of instances).
    pub fn url(&self, i: usize) -> &str {
        &self.services[i % self.services.len()].url
    }

    /// An API client on instance `i` with `token`.
    pub fn client(&self, i: usize, token: &str) -> Client {
        admin_client(self.url(i), token)
    }

    /// Kills every instance and starts them again on the same storage (new ports).
    pub async fn restart(&mut self) {
        for s in &mut self.services {
            s.stop().await.unwrap();
        }
        self.services.clear();
        for _ in 0..self.instances {
            self.services.push(ServeProcess::start(EXE.as_ref(), &self.storage, false, &[]).await.unwrap());
        }
        self.admin = admin_client(&self.services[0].url, &self.admin_token);
    }

    pub async fn fleet_info(&self) -> FleetInfo {
        self.admin.get(paths::FLEET).await.unwrap()
    }

    /// An enrollment token through the API.
    pub async fn token(&self, labels: &str, location: Option<&str>, expires_in_s: u64) -> String {
        let req = CreateEnrollmentToken {
            labels: parse_labels(labels).unwrap(),
            location: location.map(|l| l.parse().unwrap()),
            expires_in_s,
        };
        let created: TokenCreated = self.admin.send(Method::POST, paths::ENROLLMENT_TOKENS, &req).await.unwrap();
        created.token
    }

    /// A fresh data directory for device `name`.
    pub fn device_dir(&self, name: &str) -> PathBuf {
        self.work.path().join("devices").join(name)
    }

    /// Enrolls a device `name` through instance `i` with a new token carrying `labels`.
    pub async fn enroll(&self, i: usize, name: &str, labels: &str) -> Agent {
        let token = self.token(labels, Some("33.75,-84.39"), 600).await;
        agent::enroll(self.url(i), &token, &self.device_dir(name)).await.unwrap()
    }

    /// Runs the CLI against instance 0 with the admin token; returns (success, stdout, stderr).
    pub async fn cli(&self, args: &[&str]) -> (bool, String, String) {
        self.cli_as(&self.admin_token, args).await
    }

    pub async fn cli_as(&self, token: &str, args: &[&str]) -> (bool, String, String) {
        let out = tokio::process::Command::new(EXE)
            .args(args)
            .env("TIMESHARD_CONTROL_URL", self.url(0))
            .env("TIMESHARD_CONTROL_TOKEN", token)
            .output()
            .await
            .unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
    }
}

pub fn admin_client(url: &str, token: &str) -> Client {
    Client::new(&Connection { url: url.to_string(), api_token: token.to_string() }).unwrap()
}

/// The refusal code of an agent error, if the control plane refused.
pub fn code(e: &AgentError) -> Option<&str> {
    match e {
        AgentError::Http(h) => h.code(),
        _ => None,
    }
}

/// The refusal code of a CLI-client error.
pub fn client_code(e: &anyhow::Error) -> Option<String> {
    e.downcast_ref::<HttpError>().and_then(|h| h.code()).map(String::from)
}

/// Waits until `f` holds, up to `limit`; returns how long it took.
pub async fn eventually<F, Fut>(limit: Duration, mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = std::time::Instant::now();
    loop {
        if f().await {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "condition not met within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
