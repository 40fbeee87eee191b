//! A control plane of real `timeshard-control serve` processes for the end-to-end tests, and
//! local clusters of nodes enrolled with it from nothing (no hand-made PKI).
//!
//! On SQLite it is one `serve` with its data directory; on PostgreSQL two `serve` instances
//! share a throwaway server, and nodes alternate between them, so every change made through
//! instance 0 crosses instances to reach half the nodes. The processes and the throwaway
//! PostgreSQL are [`crate::control`]'s.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use http::Method;
use timeshard_control_api::api::{CreateEnrollmentToken, DeviceInfo, FleetInfo, TokenCreated, paths};
use timeshard_control_api::state::parse_labels;

use crate::cluster::{ClusterOptions, Enrollment, LocalCluster};
use crate::control::Admin;
use crate::control::postgres::ThrowawayPostgres;
use crate::control::process::{ServeProcess, Storage};

/// Where the control plane keeps its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// One `serve` on SQLite.
    Sqlite,
    /// Two `serve` instances on one throwaway PostgreSQL server.
    Postgres,
}

/// A running control plane. Dropping it kills its processes (and the PostgreSQL server).
#[derive(Debug)]
pub struct ControlPlane {
    exe: PathBuf,
    storage: Storage,
    /// Where each instance listens; kept across [`ControlPlane::stop`] and
    /// [`ControlPlane::start_again`], since enrolled nodes remember the address.
    addrs: Vec<SocketAddr>,
    services: Vec<ServeProcess>,
    /// Arguments every `serve` gets besides the storage and address.
    serve_args: Vec<String>,
    admin_token: String,
    admin: Admin,
    _postgres: Option<ThrowawayPostgres>,
}

fn addr_of(url: &str) -> Result<SocketAddr> {
    url.trim_start_matches("https://").parse().with_context(|| format!("control plane address {url}"))
}

impl ControlPlane {
    /// Starts `exe serve --init` (the `timeshard-control` binary) on `backend`, with its state
    /// in `dir` (SQLite) or a new throwaway PostgreSQL server.
    pub async fn start(exe: impl Into<PathBuf>, backend: Backend, dir: &Path) -> Result<ControlPlane> {
        ControlPlane::start_with(exe, backend, dir, Vec::new()).await
    }

    /// [`ControlPlane::start`] with more `serve` arguments (e.g. `--policy-public-key FILE`),
    /// kept for [`ControlPlane::start_again`].
    pub async fn start_with(
        exe: impl Into<PathBuf>,
        backend: Backend,
        dir: &Path,
        serve_args: Vec<String>,
    ) -> Result<ControlPlane> {
        let exe = exe.into();
        let extra: Vec<&str> = serve_args.iter().map(String::as_str).collect();
        let (storage, instances, postgres) = match backend {
            Backend::Sqlite => (Storage::Sqlite(dir.join("control-data")), 1, None),
            Backend::Postgres => {
                let pg = ThrowawayPostgres::start(false)?;
                let url = pg.create_database("timeshard")?;
                (Storage::Postgres(url), 2, Some(pg))
            }
        };
        let first = ServeProcess::start(&exe, &storage, true, &extra).await?;
        let admin_token = first.admin_token.clone().context("`serve --init` printed no admin token")?;
        let mut services = vec![first];
        for _ in 1..instances {
            services.push(ServeProcess::start(&exe, &storage, false, &extra).await?);
        }
        let addrs = services.iter().map(|s| addr_of(&s.url)).collect::<Result<Vec<_>>>()?;
        let admin = Admin::new(&services[0].url, &admin_token)?;
        Ok(ControlPlane { exe, storage, addrs, services, serve_args, admin_token, admin, _postgres: postgres })
    }

    /// `https://HOST:PORT` of every instance.
    pub fn urls(&self) -> Vec<String> {
        self.addrs.iter().map(|a| format!("https://{a}")).collect()
    }

    /// Runs `timeshard-control ARGS` against instance 0 with the admin token; returns its
    /// standard output, or fails with its standard error.
    pub async fn cli(&self, args: &[&str]) -> Result<String> {
        let out = tokio::process::Command::new(&self.exe)
            .args(args)
            .env("TIMESHARD_CONTROL_URL", &self.urls()[0])
            .env("TIMESHARD_CONTROL_TOKEN", &self.admin_token)
            .output()
            .await
            .with_context(|| format!("cannot run {}", self.exe.display()))?;
        if !out.status.success() {
            bail!("timeshard-control {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `n` one-time enrollment tokens for devices with `labels` (`k=v,k=v`) in Atlanta.
    pub async fn enrollment_tokens(&self, n: usize, labels: &str) -> Result<Vec<String>> {
        let request = CreateEnrollmentToken {
            labels: parse_labels(labels).map_err(anyhow::Error::msg)?,
            location: Some("33.75,-84.39".parse()?),
            expires_in_s: 600,
        };
        let mut tokens = Vec::with_capacity(n);
        for _ in 0..n {
            let created: TokenCreated = self.admin.send(Method::POST, paths::ENROLLMENT_TOKENS, &request).await?;
            tokens.push(created.token);
        }
        Ok(tokens)
    }

    /// The enrolled devices and what each reports.
    pub async fn devices(&self) -> Result<Vec<DeviceInfo>> {
        self.admin.get(paths::DEVICES).await
    }

    /// The fleet's CA fingerprint, generation and digest.
    pub async fn fleet(&self) -> Result<FleetInfo> {
        self.admin.get(paths::FLEET).await
    }

    /// Kills every instance (the database stays).
    pub async fn stop(&mut self) -> Result<()> {
        for s in &mut self.services {
            s.stop().await?;
        }
        self.services.clear();
        Ok(())
    }

    /// Starts the instances again on their old addresses.
    pub async fn start_again(&mut self) -> Result<()> {
        let args = self.serve_args.clone();
        self.start_again_with(args).await
    }

    /// Starts the instances again on their old addresses with other `serve` arguments.
    pub async fn start_again_with(&mut self, serve_args: Vec<String>) -> Result<()> {
        if !self.services.is_empty() {
            bail!("the control plane is running");
        }
        let extra: Vec<&str> = serve_args.iter().map(String::as_str).collect();
        for &addr in &self.addrs {
            self.services.push(ServeProcess::start_on(&self.exe, &self.storage, addr, false, &extra).await?);
        }
        self.serve_args = serve_args;
        Ok(())
    }

    /// Enrolls the nodes of `options` from nothing: a node configuration names node 0's
    /// address as every node's bootstrap peer, each node gets a one-time token (labels
    /// `site=e2e`), enrolls through instance `i % instances` at its first start and follows it.
    pub async fn enroll_cluster(&self, options: ClusterOptions) -> Result<LocalCluster> {
        let labels = vec!["site=e2e".to_string(); options.nodes];
        self.enroll_cluster_labelled(options, &labels).await
    }

    /// [`ControlPlane::enroll_cluster`] with node `i`'s token carrying `labels[i]` (`k=v,k=v`).
    pub async fn enroll_cluster_labelled(
        &self,
        mut options: ClusterOptions,
        labels: &[String],
    ) -> Result<LocalCluster> {
        if labels.len() != options.nodes {
            bail!("{} label sets for {} nodes", labels.len(), options.nodes);
        }
        let first_addr = std::net::UdpSocket::bind("127.0.0.1:0")?.local_addr()?;
        let seed = first_addr.to_string();
        self.cli(&["node-config", "set", "seeds", "--bootstrap", &seed, "--allow-empty"]).await?;
        let mut tokens = Vec::with_capacity(labels.len());
        for l in labels {
            tokens.extend(self.enrollment_tokens(1, l).await?);
        }
        options.enroll = Some(Enrollment { urls: self.urls(), tokens, first_addr: Some(first_addr) });
        LocalCluster::start(options).await
    }

    /// Enrolls one more node into `cluster` with `labels`; returns its index.
    pub async fn enroll_another(&self, cluster: &mut LocalCluster, labels: &str) -> Result<usize> {
        let token = self.enrollment_tokens(1, labels).await?.remove(0);
        cluster.add_enrolled(token).await
    }
}
