//! `timeshard-control serve`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;

use crate::db::{Db, redact};
use crate::fleet::{Fleet, Policy, follow, monitor};
use crate::sealed::Kek;
use crate::server::{self, Limits};

const SERVE_EXAMPLES: &str = "\
Examples:
  # First start: creates the fleet CA and prints the first admin token (once).
  timeshard-control serve --init --data-dir /var/lib/timeshard-control --listen 0.0.0.0:7443
  # Later starts keep everything in the data directory:
  timeshard-control serve --data-dir /var/lib/timeshard-control --listen 0.0.0.0:7443
  # PostgreSQL instead of SQLite; run several instances on one database to scale out:
  timeshard-control serve --database postgres://timeshard@db.example/timeshard --listen 0.0.0.0:7443

The fleet CA's private key and the policy signing key are stored in the database sealed under a
key-encryption key kept apart from it: --key-encryption-key-file (made on first start; by
default <data-dir>/key-encryption-key) or TIMESHARD_CONTROL_KEK (64 hex digits). Back that key up
apart from the database: without it the keys cannot be opened, and a database dump without it
mints nothing. The service refuses to start when its files are readable by others.";

/// `serve` options.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = SERVE_EXAMPLES)]
pub struct ServeArgs {
    /// Directory for the SQLite database (`control.db`), created if missing.
    #[arg(long, default_value = "timeshard-control-data", env = "TIMESHARD_CONTROL_DATA_DIR")]
    pub data_dir: PathBuf,
    /// PostgreSQL instead of SQLite: `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE`.
    #[arg(long, env = "TIMESHARD_CONTROL_DATABASE", hide_env_values = true)]
    pub database: Option<String>,
    /// Address for the HTTPS API. Port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:7443")]
    pub listen: SocketAddr,
    /// Create the first admin API token and print it (only on a fleet without API tokens).
    #[arg(long)]
    pub init: bool,
    /// Lifetime of node certificates (at least 1m; under 1h only for tests); nodes renew after
    /// two thirds of it.
    #[arg(long, default_value = "7days", value_parser = humantime::parse_duration)]
    pub cert_lifetime: Duration,
    /// Connections accepted at once.
    #[arg(long, default_value_t = Limits::default().max_connections)]
    pub max_connections: usize,
    /// Requests (other than watches) in progress at once; more wait up to 5 s, then get 503.
    #[arg(long, default_value_t = Limits::default().max_requests)]
    pub max_requests: usize,
    /// Watching nodes at once; more get 503 and retry.
    #[arg(long, default_value_t = Limits::default().max_watchers)]
    pub max_watchers: usize,
    /// Requests without credentials (enrollments, health checks) in progress at once, apart
    /// from --max-requests so that they cannot starve operators and nodes.
    #[arg(long, default_value_t = Limits::default().max_open_requests)]
    pub max_open_requests: usize,
    /// Longest a client may take to send a request's body (slower: 408).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub body_timeout: Duration,
    /// Sign policies offline: the public key file (or line) of the key made by
    /// `timeshard-control policy keygen`. Devices pin it when they enroll; the service signs no
    /// policy and accepts only uploads signed with it (`policy upload --signature`).
    #[arg(long, value_name = "FILE")]
    pub policy_public_key: Option<PathBuf>,
    /// The key-encryption key the stored keys are sealed under (64 hex digits), made here on
    /// first start if missing. Default: `<data-dir>/key-encryption-key`; required with
    /// --database unless TIMESHARD_CONTROL_KEK holds the key itself.
    #[arg(long, env = "TIMESHARD_CONTROL_KEK_FILE")]
    pub key_encryption_key_file: Option<PathBuf>,
}

/// The environment variable that may hold the key-encryption key itself.
pub const KEK_ENV: &str = "TIMESHARD_CONTROL_KEK";

/// The key-encryption key `args` select: [`KEK_ENV`], else the file (made on first start).
pub fn load_kek(args: &ServeArgs) -> anyhow::Result<Kek> {
    if let Ok(hex) = std::env::var(KEK_ENV) {
        return Kek::from_hex(&hex).context(KEK_ENV);
    }
    let path = match (&args.key_encryption_key_file, &args.database) {
        (Some(path), _) => path.clone(),
        (None, None) => args.data_dir.join("key-encryption-key"),
        (None, Some(_)) => anyhow::bail!(
            "with --database, give the key-encryption key the fleet's keys are sealed under: \
             --key-encryption-key-file PATH (made there if missing) or {KEK_ENV} (64 hex digits); keep it \
             apart from the database, and the same for every instance"
        ),
    };
    if !path.exists() {
        create_private_file(&path, &format!("{}\n", Kek::generate_hex()?))
            .context("cannot create the key-encryption key")?;
        tracing::warn!(
            path = %path.display(),
            "made a new key-encryption key; back it up apart from the database: without it the fleet's keys cannot be opened"
        );
    }
    refuse_if_shared(&path)?;
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    Kek::from_hex(&text).with_context(|| format!("{}", path.display()))
}

/// Refuses a file or directory that users other than its owner may read.
fn refuse_if_shared(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?.permissions().mode();
    if mode & 0o077 != 0 {
        anyhow::bail!(
            "{} is open to other users (mode {:o}); it guards the fleet's keys: chmod go-rwx {}",
            path.display(),
            mode & 0o777,
            path.display()
        );
    }
    Ok(())
}

/// The database URL `args` select.
pub fn database_url(args: &ServeArgs) -> anyhow::Result<String> {
    if let Some(url) = &args.database {
        return Ok(url.clone());
    }
    create_private_dir(&args.data_dir)?;
    refuse_if_shared(&args.data_dir)?;
    let path = args.data_dir.join("control.db");
    if !path.exists() {
        create_private_file(&path, "")?;
    }
    refuse_if_shared(&path)?;
    let path = path.to_str().context("the data directory's path must be UTF-8")?;
    Ok(format!("sqlite://{path}?mode=rwc"))
}

/// Creates `path` (it must not exist) readable by its owner only, with `contents`, synced.
fn create_private_file(path: &Path, contents: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(contents.as_bytes())?;
    file.sync_all().with_context(|| format!("cannot sync {}", path.display()))
}

fn create_private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create the data directory {}", dir.display()))
}

/// Holds an exclusive lock on `dir/serve.lock` while the returned file is open.
fn lock_data_dir(dir: &Path) -> anyhow::Result<std::fs::File> {
    let path = dir.join("serve.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
            "another `timeshard-control serve` is using {}; run one per data directory, or use \
             --database postgres://... to run several instances on one fleet",
            dir.display()
        ),
        Err(std::fs::TryLockError::Error(e)) => Err(e).with_context(|| format!("cannot lock {}", path.display())),
    }
}

/// Runs the service until SIGINT or SIGTERM.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let url = database_url(&args)?;
    // SQLite has one writer: one `serve` per data directory (PostgreSQL takes several).
    let _lock = match &args.database {
        None => Some(lock_data_dir(&args.data_dir)?),
        Some(_) => None,
    };
    if args.cert_lifetime < Duration::from_secs(60) {
        anyhow::bail!("--cert-lifetime must be at least 1m (nodes renew after two thirds of it)");
    }
    if args.cert_lifetime < Duration::from_secs(3600) {
        eprintln!(
            "warning: --cert-lifetime {} is meant for tests: nodes renew every {}, and a node whose certificate \
             expired more than 14 days ago (the grace) must enroll again",
            humantime::format_duration(args.cert_lifetime),
            humantime::format_duration(args.cert_lifetime * 2 / 3)
        );
    }
    let kek = load_kek(&args)?;
    let db = Db::connect(&url, kek).await.with_context(|| format!("database {}", redact(&url)))?;
    let backend = db.backend();
    let offline_policy_key = match &args.policy_public_key {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
            Some(
                timeshard_policy::signing::PublicKey::from_text(&text)
                    .with_context(|| format!("{}", path.display()))?,
            )
        }
        None => None,
    };
    let policy = Policy { cert_lifetime: args.cert_lifetime, offline_policy_key, ..Policy::default() };
    let fleet = Fleet::open(db, policy).await?;
    let listener = TcpListener::bind(args.listen).await.with_context(|| format!("cannot listen on {}", args.listen))?;
    let mut addr = listener.local_addr()?;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let admin = if args.init { Some(fleet.init_admin().await?) } else { None };
    let state = fleet.current();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "timeshard-control: fleet {} ({backend:?}), generation {}",
        fleet.ca.fingerprint(),
        state.generation
    )?;
    writeln!(out, "timeshard-control: listening on https://{addr}")?;
    if let Some(token) = admin {
        writeln!(out, "# The admin token is shown this once; keep it secret.")?;
        writeln!(out, "export TIMESHARD_CONTROL_URL=https://{addr}")?;
        writeln!(out, "export TIMESHARD_CONTROL_TOKEN={token}")?;
    }
    out.flush()?;
    drop(out);
    let _followers = follow::spawn(fleet.clone());
    let _monitor = monitor::spawn(fleet.clone());
    let limits = Limits {
        max_connections: args.max_connections.max(1),
        max_requests: args.max_requests.max(1),
        max_watchers: args.max_watchers.max(1),
        max_open_requests: args.max_open_requests.max(1),
        body_timeout: args.body_timeout.max(Duration::from_millis(100)),
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = server::serve(fleet.clone(), listener, limits) => result?,
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    fleet.db.pool().close().await;
    Ok(())
}
