//! `timeshard-control serve` as a child process, for the tests and the fleet benchmark: started on a
//! free loopback port, its address (and, with `--init`, the admin token) read from what it
//! prints, killed on drop.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Where a service keeps its state.
#[derive(Clone, Debug)]
pub enum Storage {
    /// SQLite in this data directory.
    Sqlite(PathBuf),
    /// This PostgreSQL database.
    Postgres(String),
}

/// A running `serve`.
#[derive(Debug)]
pub struct ServeProcess {
    child: Child,
    pub url: String,
    /// The admin token, when started with `--init`.
    pub admin_token: Option<String>,
}

impl ServeProcess {
    /// Starts `exe serve` on `storage` with `extra` arguments and waits until it listens, on a
    /// port it can come back to after a stop ([`crate::ports::stable_loopback`]).
    pub async fn start(exe: &Path, storage: &Storage, init: bool, extra: &[&str]) -> anyhow::Result<ServeProcess> {
        ServeProcess::start_on(exe, storage, crate::ports::stable_loopback()?, init, extra).await
    }

    /// [`ServeProcess::start`] listening on `listen` (to come back where devices enrolled).
    pub async fn start_on(
        exe: &Path,
        storage: &Storage,
        listen: SocketAddr,
        init: bool,
        extra: &[&str],
    ) -> anyhow::Result<ServeProcess> {
        let mut cmd = Command::new(exe);
        cmd.arg("serve").arg("--listen").arg(listen.to_string());
        match storage {
            Storage::Sqlite(dir) => cmd.arg("--data-dir").arg(dir),
            // Every instance on one database needs the same key-encryption key; a test's is
            // derived from the database's address (never do this with a real fleet).
            Storage::Postgres(url) => cmd.args(["--database", url]).env(
                "TIMESHARD_CONTROL_KEK",
                timeshard_control_api::token::hex(&timeshard_control_api::token::sha256(url.as_bytes())),
            ),
        };
        if init {
            cmd.arg("--init");
        }
        cmd.args(extra).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit()).kill_on_drop(true);
        let mut child = cmd.spawn().with_context(|| format!("cannot start {}", exe.display()))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let (mut url, mut admin_token) = (None, None);
        let read = async {
            while let Some(line) = lines.next_line().await? {
                if let Some(u) = line.strip_prefix("timeshard-control: listening on ") {
                    url = Some(u.trim().to_string());
                }
                if let Some(t) = line.strip_prefix("export TIMESHARD_CONTROL_TOKEN=") {
                    admin_token = Some(t.trim().to_string());
                }
                if url.is_some() && (!init || admin_token.is_some()) {
                    return Ok::<bool, std::io::Error>(true);
                }
            }
            Ok(false)
        };
        match tokio::time::timeout(Duration::from_secs(60), read).await {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => {
                let status = child.wait().await?;
                bail!("`timeshard-control serve` exited ({status}) before it listened; see its errors above");
            }
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => bail!("`timeshard-control serve` did not listen within 60 s"),
        }
        // Nothing more is printed on stdout; keep the pipe drained anyway.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(ServeProcess { child, url: url.context("no address")?, admin_token })
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Stops it (SIGKILL: the database must cope with that) and waits.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        self.child.kill().await?;
        Ok(())
    }

    /// Resident memory now and at its peak, in MiB, from /proc.
    pub fn rss_mb(&self) -> Option<(f64, f64)> {
        let m = crate::procfs::memory(self.pid()?).ok()?;
        let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
        Some((mib(m.rss), mib(m.peak)))
    }
}
