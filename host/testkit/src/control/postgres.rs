//! A throwaway PostgreSQL server in a temporary directory, for the tests and the fleet benchmark:
//! `initdb` and `pg_ctl` from Debian's `postgresql` package, on a free loopback port with its
//! socket in the directory, stopped and deleted on drop. PostgreSQL refuses to run as root, so
//! as root it runs as the `postgres` user (`runuser`).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// Where Debian installs the server binaries, one directory per major version.
const PG_ROOT: &str = "/usr/lib/postgresql";

/// A running throwaway server.
#[derive(Debug)]
pub struct ThrowawayPostgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    url: String,
}

/// The newest `/usr/lib/postgresql/<version>/bin` holding `initdb` and `pg_ctl`.
pub fn find_bin() -> anyhow::Result<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(PG_ROOT)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version: u32 = e.file_name().to_str()?.split('.').next()?.parse().ok()?;
            let bin = e.path().join("bin");
            (bin.join("initdb").exists() && bin.join("pg_ctl").exists()).then_some((version, bin))
        })
        .collect();
    found.sort();
    match found.pop() {
        Some((_, bin)) => Ok(bin),
        None => bail!(
            "PostgreSQL server binaries not found under {PG_ROOT}/*/bin: install them with \
             `apt-get install -y postgresql` (./scripts/test does this); the control plane's \
             PostgreSQL tests and benchmark start a throwaway server with them"
        ),
    }
}

fn running_as_root() -> bool {
    std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false)
}

/// Runs a server binary, as `postgres` when we are root.
fn run(program: &Path, args: &[&str]) -> anyhow::Result<()> {
    let mut cmd = if running_as_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    };
    let out = cmd.args(args).output().with_context(|| format!("cannot run {}", program.display()))?;
    if !out.status.success() {
        bail!(
            "{} {} failed: {}{}",
            program.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl ThrowawayPostgres {
    /// Starts a server. `durable`: fsync on (for benchmarks); off makes tests faster.
    pub fn start(durable: bool) -> anyhow::Result<ThrowawayPostgres> {
        let bin = find_bin()?;
        let dir = tempfile::Builder::new().prefix("timeshard-pg-").tempdir()?;
        if running_as_root() {
            let status = Command::new("chown").arg("postgres:postgres").arg(dir.path()).status()?;
            if !status.success() {
                bail!("cannot give {} to the postgres user", dir.path().display());
            }
        }
        let data = dir.path().join("data");
        let (data_s, dir_s) = (data.to_str().context("temp path")?, dir.path().to_str().context("temp path")?);
        run(
            &bin.join("initdb"),
            &["-D", data_s, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"],
        )?;
        let port = free_port()?;
        let fsync = if durable { "" } else { " -c fsync=off -c synchronous_commit=off -c full_page_writes=off" };
        let options = format!("-p {port} -k {dir_s} -c listen_addresses=127.0.0.1 -c max_connections=300{fsync}");
        let log = dir.path().join("postgres.log");
        let started = run(
            &bin.join("pg_ctl"),
            &["-D", data_s, "-o", &options, "-l", log.to_str().context("temp path")?, "-w", "-t", "60", "start"],
        );
        if let Err(e) = started {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            bail!("{e}\nserver log:\n{log}");
        }
        let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
        Ok(ThrowawayPostgres { dir, bin, port, url })
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A new empty database on this server, and its URL.
    pub fn create_database(&self, name: &str) -> anyhow::Result<String> {
        let dir = self.dir.path().to_str().context("temp path")?;
        let port = self.port.to_string();
        run(&self.bin.join("createdb"), &["-h", dir, "-p", &port, "-U", "postgres", name])?;
        Ok(format!("postgres://postgres@127.0.0.1:{}/{name}", self.port))
    }
}

impl Drop for ThrowawayPostgres {
    fn drop(&mut self) {
        let data = self.dir.path().join("data");
        if let Some(data) = data.to_str() {
            let _ = run(&self.bin.join("pg_ctl"), &["-D", data, "-m", "immediate", "-w", "stop"]);
        }
    }
}
