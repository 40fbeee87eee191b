//! The commands that talk to a running service: tokens, classes, node configurations,
//! devices, audit. Output is a short table (or `--json`); errors are the service's, which say
//! what to do.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use http::Method;
use timeshard_control_api::api::StorageStatus;
use timeshard_control_api::api::{
    ApiTokenInfo, AuditEntry, Changed, CreateApiToken, CreateEnrollmentToken, DeviceInfo, EnrollmentTokenInfo,
    FleetInfo, PutClasses, PutNodeConfig, RevokeDevice, SetDeviceLocation, TokenCreated, paths,
};
use timeshard_control_api::class::{ByteSize, OnFull, parse_coi};
use timeshard_control_api::state::{LIMIT_NAMES, NodeConfigEntry, NodeSettings, Selector, parse_labels};
use timeshard_control_api::{ClassSpec, Location};
use timeshard_proto::{AgeBy, KeyFormat};

use super::client::{Client, Connection};
use crate::time::{now_ms, show_ms};

pub(crate) fn labels_arg(s: &str) -> Result<BTreeMap<String, String>, String> {
    parse_labels(s)
}

pub(crate) fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

pub(crate) fn show_labels(labels: &BTreeMap<String, String>) -> String {
    if labels.is_empty() {
        return "-".into();
    }
    labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

pub(crate) fn show_opt_ms(ms: Option<i64>) -> String {
    ms.map(show_ms).unwrap_or_else(|| "-".into())
}

/// Prints rows as aligned columns.
pub(crate) fn table(header: &[&str], rows: Vec<Vec<String>>) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(header.iter().map(|h| h.to_string()).collect());
    for row in rows {
        line(row);
    }
}

const TOKEN_EXAMPLES: &str = "\
Examples:
  timeshard-control token create --labels site=atl,rack=3 --location 33.75,-84.39 --expires 1h
  TOKEN=$(timeshard-control token create --labels site=sfo --expires 15m)
  timeshard-control token list";

/// `token ...`: enrollment tokens.
#[derive(Debug, clap::Subcommand)]
#[command(after_help = TOKEN_EXAMPLES)]
pub enum TokenCommand {
    /// Create a one-time enrollment token; prints only the token on standard output.
    #[command(after_help = TOKEN_EXAMPLES)]
    Create {
        /// Labels the device gets: key=value,key=value (node configurations select by them).
        #[arg(long, value_parser = labels_arg, default_value = "")]
        labels: BTreeMap<String, String>,
        /// Where the device is: LAT,LON in degrees (geohash selectors match it).
        #[arg(long, value_name = "LAT,LON", allow_hyphen_values = true)]
        location: Option<Location>,
        /// How long the token stays usable (e.g. 15m, 1h, 7d).
        #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
        expires: Duration,
        /// Print the token, its id and its expiry as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Connection,
    },
    /// List enrollment tokens (never their secrets): labels, expiry, which device used each.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Connection,
    },
}

pub async fn token(cmd: TokenCommand) -> anyhow::Result<()> {
    match cmd {
        TokenCommand::Create { labels, location, expires, json, conn } => {
            let client = Client::new(&conn)?;
            let req = CreateEnrollmentToken { labels, location, expires_in_s: expires.as_secs().max(1) };
            let created: TokenCreated = client.send(Method::POST, paths::ENROLLMENT_TOKENS, &req).await?;
            if json {
                return print_json(&created);
            }
            println!("{}", created.token);
            eprintln!(
                "single use, expires {}; on the device: timeshard node --enroll {} --token <the token> --data-dir DIR",
                show_opt_ms(created.expires_at_ms),
                conn.url
            );
            Ok(())
        }
        TokenCommand::List { json, conn } => {
            let tokens: Vec<EnrollmentTokenInfo> = Client::new(&conn)?.get(paths::ENROLLMENT_TOKENS).await?;
            if json {
                return print_json(&tokens);
            }
            let now = now_ms();
            let rows = tokens
                .into_iter()
                .map(|t| {
                    let state = match (&t.used_by, t.expires_at_ms <= now) {
                        (Some(node), _) => format!("used by {node}"),
                        (None, true) => "expired".into(),
                        (None, false) => "unused".into(),
                    };
                    vec![t.id, show_labels(&t.labels), show_ms(t.expires_at_ms), state]
                })
                .collect();
            table(&["ID", "LABELS", "EXPIRES", "STATE"], rows);
            Ok(())
        }
    }
}

const API_TOKEN_EXAMPLES: &str = "\
Examples:
  timeshard-control api-token create --name alice --role operator
  timeshard-control api-token create --name grafana --role viewer --expires 90d
  timeshard-control api-token list
  timeshard-control api-token revoke 0123456789abcdef

Roles: viewer reads everything; operator also changes desired state, creates enrollment tokens
and revokes devices; admin also manages API tokens.";

/// `api-token ...`.
#[derive(Debug, clap::Subcommand)]
#[command(after_help = API_TOKEN_EXAMPLES)]
pub enum ApiTokenCommand {
    /// Create an API token (admin); prints only the token on standard output.
    #[command(after_help = API_TOKEN_EXAMPLES)]
    Create {
        /// Who or what uses it (shown in the audit log).
        #[arg(long)]
        name: String,
        /// admin, operator or viewer.
        #[arg(long)]
        role: String,
        /// Expiry (e.g. 30d, at most 10 years); 90 days by default.
        #[arg(long, value_parser = humantime::parse_duration)]
        expires: Option<Duration>,
        #[command(flatten)]
        conn: Connection,
    },
    /// List API tokens (admin).
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Connection,
    },
    /// Revoke an API token by id (admin).
    Revoke {
        id: String,
        #[command(flatten)]
        conn: Connection,
    },
}

pub async fn api_token(cmd: ApiTokenCommand) -> anyhow::Result<()> {
    match cmd {
        ApiTokenCommand::Create { name, role, expires, conn } => {
            let req = CreateApiToken { name, role, expires_in_s: expires.map(|d| d.as_secs().max(1)) };
            let created: TokenCreated = Client::new(&conn)?.send(Method::POST, paths::API_TOKENS, &req).await?;
            println!("{}", created.token);
            eprintln!("API token {} created; it is shown this once", created.id);
            Ok(())
        }
        ApiTokenCommand::List { json, conn } => {
            let tokens: Vec<ApiTokenInfo> = Client::new(&conn)?.get(paths::API_TOKENS).await?;
            if json {
                return print_json(&tokens);
            }
            let rows = tokens
                .into_iter()
                .map(|t| {
                    let state = if t.revoked_at_ms.is_some() { "revoked" } else { "active" };
                    vec![t.id, t.name, t.role.to_string(), show_opt_ms(t.expires_at_ms), state.into()]
                })
                .collect();
            table(&["ID", "NAME", "ROLE", "EXPIRES", "STATE"], rows);
            Ok(())
        }
        ApiTokenCommand::Revoke { id, conn } => {
            Client::new(&conn)?.call(Method::DELETE, &format!("{}/{id}", paths::API_TOKENS)).await?;
            eprintln!("API token {id} revoked");
            Ok(())
        }
    }
}

const CLASS_EXAMPLES: &str = "\
Examples:
  # A new class (unset options take the node's defaults: qfi, 10s, rf 3, w 2, r 2, kept forever):
  timeshard-control class set pmu --prefix pmu. --quantum 10s --rf 3 --w 2 --r 2 --retention 30d
  # Change one setting of an existing class; the others stay:
  timeshard-control class set pmu --retention 7d
  timeshard-control class set history --prefix hist. --archive true --hot 30d
  # Context of interest (FogStore): 2 replicas near each series' location, 1 far away:
  timeshard-control class set traffic --prefix traffic. \\
      --coi n_in=2,n_out=1,in_coi_dist=50km,out_coi_dist=1000km,coi_size=50km,precision=5
  timeshard-control class set traffic --coi in_coi_dist=80km    # change one parameter
  timeshard-control class set traffic --no-coi
  # Several classes at once, all or none (JSON: {\"classes\": [...]} or a list of classes):
  timeshard-control class set --file classes.json
  timeshard-control class list
  timeshard-control class rm pmu

A class's prefix, format and quantum decide where its stored blocks live, so they cannot change;
add a class with another prefix instead. Two classes cannot share a prefix. A class with --coi
derives rf, w and r from it (n_in + n_out replicas, quorums over the n_in); its series are placed
by their location (tags geohash= or lat=/lon=, or the coi's location=), on nodes whose location
the control plane gives them (`device set-location`, or the enrollment token's --location).";

/// `class ...`.
#[derive(Debug, clap::Subcommand)]
#[command(after_help = CLASS_EXAMPLES)]
pub enum ClassCommand {
    /// Add a class or change settings of one (operator).
    #[command(after_help = CLASS_EXAMPLES)]
    Set {
        /// Class name (letters, digits, '-', '_', '.').
        #[arg(required_unless_present = "file")]
        name: Option<String>,
        /// Metric prefix of the series in the class ('' for the catch-all class).
        #[arg(long)]
        prefix: Option<String>,
        /// qfi (history spread over the network) or kfi (history on the same few nodes).
        #[arg(long)]
        format: Option<KeyFormat>,
        /// Quantum length (1ms to 366d).
        #[arg(long, value_parser = humantime::parse_duration)]
        quantum: Option<Duration>,
        /// Replicas per block.
        #[arg(long)]
        rf: Option<u8>,
        /// Acknowledgements a write waits for (default 2, at most --rf).
        #[arg(long)]
        w: Option<u8>,
        /// Replicas a read asks (default 2, at most --rf).
        #[arg(long)]
        r: Option<u8>,
        /// How long points are kept (by event time).
        #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "keep_forever")]
        retention: Option<Duration>,
        /// Keep points forever (clears a retention).
        #[arg(long)]
        keep_forever: bool,
        /// Export sealed blocks past the hot window to each node's archive (`[tier] url`).
        #[arg(long)]
        archive: Option<bool>,
        /// With --archive: classes with a higher priority (0-255) are exported first.
        #[arg(long)]
        export_priority: Option<u8>,
        /// The hot window of an archived class (default 30d).
        #[arg(long, value_parser = humantime::parse_duration)]
        hot: Option<Duration>,
        /// What the hot window and retention measure: event (the points' time) or write (arrival).
        #[arg(long)]
        age_by: Option<AgeBy>,
        /// Context-of-interest parameters NAME=VALUE,...: n_in, n_out, in_coi_dist,
        /// out_coi_dist, coi_size (km or m: 50km, 500m), precision (geohash characters, 1-12)
        /// and an optional default location (geohash or LAT,LON); given ones change, others stay.
        #[arg(long, value_name = "NAME=VALUE,...", allow_hyphen_values = true, conflicts_with = "no_coi")]
        coi: Option<String>,
        /// Place the class's series by node id again (clears its coi).
        #[arg(long)]
        no_coi: bool,
        /// Most bytes the class may hold in each node's store (e.g. 2GiB).
        #[arg(long, conflicts_with = "no_quota")]
        quota: Option<ByteSize>,
        /// Remove the class's quota.
        #[arg(long)]
        no_quota: bool,
        /// At the quota: refuse writes (default), or evict_oldest (drop the oldest blocks; an
        /// archived class drops only what the archive holds).
        #[arg(long)]
        on_full: Option<OnFull>,
        /// Set the classes in this JSON file instead, in one change.
        #[arg(long, conflicts_with_all = ["name", "prefix", "format", "quantum", "rf", "w", "r", "retention", "keep_forever", "archive", "export_priority", "hot", "age_by", "coi", "no_coi", "quota", "no_quota", "on_full"])]
        file: Option<PathBuf>,
        #[command(flatten)]
        conn: Connection,
    },
    /// Remove a class (operator).
    Rm {
        name: String,
        #[command(flatten)]
        conn: Connection,
    },
    /// List classes.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Connection,
    },
}

fn read_class_file(path: &PathBuf) -> anyhow::Result<Vec<ClassSpec>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    if let Ok(put) = serde_json::from_str::<PutClasses>(&text) {
        return Ok(put.classes);
    }
    serde_json::from_str::<Vec<ClassSpec>>(&text)
        .with_context(|| format!("{} is not a JSON list of classes nor {{\"classes\": [...]}}", path.display()))
}

pub async fn class(cmd: ClassCommand) -> anyhow::Result<()> {
    match cmd {
        ClassCommand::Set {
            name,
            prefix,
            format,
            quantum,
            rf,
            w,
            r,
            retention,
            keep_forever,
            archive,
            export_priority,
            hot,
            age_by,
            coi,
            no_coi,
            quota,
            no_quota,
            on_full,
            file,
            conn,
        } => {
            let client = Client::new(&conn)?;
            let classes = match (file, name) {
                (Some(path), _) => read_class_file(&path)?,
                (None, Some(name)) => {
                    let existing: Vec<ClassSpec> = client.get(paths::CLASSES).await?;
                    let mut class = match existing.into_iter().find(|c| c.name == name) {
                        Some(c) => c,
                        None => {
                            let Some(prefix) = &prefix else {
                                bail!("class {name:?} is new: give its --prefix (--prefix '' for the catch-all class)");
                            };
                            ClassSpec::new(&name, prefix)
                        }
                    };
                    if let Some(p) = prefix {
                        class.metric_prefix = p;
                    }
                    class.format = format.unwrap_or(class.format);
                    class.quantum = quantum.unwrap_or(class.quantum);
                    class.rf = rf.unwrap_or(class.rf);
                    // Quorums not given fit a smaller RF (`--rf 1` alone means W = R = 1).
                    class.w = w.unwrap_or(class.w.min(class.rf));
                    class.r = r.unwrap_or(class.r.min(class.rf));
                    if retention.is_some() || keep_forever {
                        class.retention = retention;
                    }
                    class.archive = archive.unwrap_or(class.archive);
                    class.export_priority = export_priority.unwrap_or(class.export_priority);
                    if !class.archive {
                        class.hot = None;
                    }
                    class.hot = hot.or(class.hot);
                    class.age_by = age_by.unwrap_or(class.age_by);
                    if let Some(text) = coi {
                        let spec = parse_coi(&text, class.coi.as_ref()).map_err(|e| anyhow::anyhow!("--coi: {e}"))?;
                        class.coi = Some(spec);
                    }
                    if no_coi {
                        class.coi = None;
                    }
                    if quota.is_some() || no_quota {
                        class.quota = quota;
                    }
                    if no_quota {
                        class.on_full = OnFull::Refuse;
                    }
                    class.on_full = on_full.unwrap_or(class.on_full);
                    vec![class]
                }
                (None, None) => bail!("give a class name, or --file"),
            };
            let changed: Changed = client.send(Method::PUT, paths::CLASSES, &PutClasses { classes }).await?;
            eprintln!("generation {}", changed.generation);
            Ok(())
        }
        ClassCommand::Rm { name, conn } => {
            let changed: Changed =
                Client::new(&conn)?.send(Method::DELETE, &format!("{}/{name}", paths::CLASSES), &()).await?;
            eprintln!("class {name} removed; generation {}", changed.generation);
            Ok(())
        }
        ClassCommand::List { json, conn } => {
            let classes: Vec<ClassSpec> = Client::new(&conn)?.get(paths::CLASSES).await?;
            if json {
                return print_json(&classes);
            }
            let dur = |d: Duration| humantime::format_duration(d).to_string();
            let rows = classes
                .into_iter()
                .map(|c| {
                    let replication = c.replication();
                    let coi = match &c.coi {
                        Some(k) => format!(
                            "in {} within {}, out {} beyond {}, size {}, precision {}",
                            k.n_in, k.in_coi_dist, k.n_out, k.out_coi_dist, k.coi_size, k.precision
                        ),
                        None => "-".into(),
                    };
                    vec![
                        c.name,
                        format!("{:?}", c.metric_prefix),
                        c.format.to_string(),
                        dur(c.quantum),
                        format!("{}/{}/{}", replication.rf, replication.w, replication.r),
                        c.retention.map(dur).unwrap_or_else(|| "forever".into()),
                        if c.archive {
                            format!("after {}", dur(c.hot.unwrap_or(timeshard_control_api::class::DEFAULT_HOT)))
                        } else {
                            "no".into()
                        },
                        c.age_by.to_string(),
                        coi,
                        c.quota.map_or_else(|| "-".into(), |q| format!("{q}, then {}", c.on_full)),
                    ]
                })
                .collect();
            table(
                &["NAME", "PREFIX", "FORMAT", "QUANTUM", "RF/W/R", "RETENTION", "ARCHIVE", "AGE BY", "COI", "QUOTA"],
                rows,
            );
            Ok(())
        }
    }
}

const NODE_CONFIG_EXAMPLES: &str = "\
Examples:
  timeshard-control node-config set atl --select site=atl --bootstrap 10.0.0.5:7400,10.0.0.6:7400
  timeshard-control node-config set georgia --geohash dn --limit max_connections=2048
  timeshard-control node-config set small --select hw=bbb --priority 10 --limit read_parallelism=8
  timeshard-control node-config set later --select site=nyc --bootstrap 10.1.0.5:7400 --allow-empty
  timeshard-control node-config list

Where several configurations select a device, they apply in ascending --priority (then name),
later ones overriding the settings they give.";

/// `node-config ...`.
#[derive(Debug, clap::Subcommand)]
#[command(after_help = NODE_CONFIG_EXAMPLES)]
pub enum NodeConfigCommand {
    /// Create or replace a node configuration (operator).
    #[command(after_help = NODE_CONFIG_EXAMPLES)]
    Set {
        /// Name of this configuration.
        name: String,
        /// Labels a device must have: key=value,key=value (none: every device).
        #[arg(long, value_parser = labels_arg, default_value = "")]
        select: BTreeMap<String, String>,
        /// Geohash prefix the device's location must have (e.g. dn5 for Atlanta).
        #[arg(long)]
        geohash: Option<String>,
        /// Order among configurations that select the same device (higher wins).
        #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
        priority: i32,
        /// Peers to join through: host:port,host:port.
        #[arg(long, value_delimiter = ',')]
        bootstrap: Option<Vec<String>>,
        /// A limit as NAME=VALUE (repeat for several); names: max_concurrent_requests,
        /// max_connections, read_parallelism, max_quanta_per_page.
        #[arg(long = "limit", value_name = "NAME=VALUE")]
        limits: Vec<String>,
        /// Accept a selector that matches no enrolled device yet.
        #[arg(long)]
        allow_empty: bool,
        #[command(flatten)]
        conn: Connection,
    },
    /// Remove a node configuration (operator).
    Rm {
        name: String,
        #[command(flatten)]
        conn: Connection,
    },
    /// List node configurations.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Connection,
    },
}

pub async fn node_config(cmd: NodeConfigCommand) -> anyhow::Result<()> {
    match cmd {
        NodeConfigCommand::Set { name, select, geohash, priority, bootstrap, limits, allow_empty, conn } => {
            let mut settings = NodeSettings { bootstrap, ..Default::default() };
            for l in &limits {
                let (k, v) = l.split_once('=').with_context(|| {
                    format!("--limit {l:?} must be NAME=VALUE with NAME one of {}", LIMIT_NAMES.join(", "))
                })?;
                let v: u32 = v.trim().parse().with_context(|| format!("--limit {l:?}: the value is not a number"))?;
                settings.limits.set(k.trim(), v).map_err(anyhow::Error::msg)?;
            }
            let req = PutNodeConfig { selector: Selector { labels: select, geohash }, priority, settings, allow_empty };
            let changed: Changed =
                Client::new(&conn)?.send(Method::PUT, &format!("{}/{name}", paths::NODE_CONFIGS), &req).await?;
            eprintln!("generation {}; selects {} device(s) now", changed.generation, changed.matched.unwrap_or(0));
            Ok(())
        }
        NodeConfigCommand::Rm { name, conn } => {
            let changed: Changed =
                Client::new(&conn)?.send(Method::DELETE, &format!("{}/{name}", paths::NODE_CONFIGS), &()).await?;
            eprintln!("node configuration {name} removed; generation {}", changed.generation);
            Ok(())
        }
        NodeConfigCommand::List { json, conn } => {
            let entries: Vec<NodeConfigEntry> = Client::new(&conn)?.get(paths::NODE_CONFIGS).await?;
            if json {
                return print_json(&entries);
            }
            let rows = entries
                .into_iter()
                .map(|e| {
                    let settings = serde_json::to_string(&e.settings).unwrap_or_default();
                    vec![e.name, e.selector.to_string(), e.priority.to_string(), settings]
                })
                .collect();
            table(&["NAME", "SELECTS", "PRIORITY", "SETTINGS"], rows);
            Ok(())
        }
    }
}

/// `devices`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  timeshard-control devices\n  timeshard-control devices --json | jq '.[] | select(.health != \"ok\")'"
)]
pub struct DevicesArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: Connection,
}

pub async fn devices(args: DevicesArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.conn)?;
    let devices: Vec<DeviceInfo> = client.get(paths::DEVICES).await?;
    if args.json {
        return print_json(&devices);
    }
    let fleet: FleetInfo = client.get(paths::FLEET).await?;
    let rows = devices
        .into_iter()
        .map(|d| {
            let applied = match (d.generation_applied, &d.digest_applied) {
                (Some(g), Some(digest)) if *digest == fleet.digest => format!("{g} (current)"),
                (Some(g), _) => format!("{g} (behind {})", fleet.generation),
                (None, _) => "-".into(),
            };
            let mut health = match (&d.revoked_at_ms, d.health, &d.apply_error) {
                (Some(_), _, _) => "REVOKED".to_string(),
                (None, _, Some(e)) => format!("cannot apply {}: {}", e.generation, e.message),
                (None, Some(h), None) => format!("{h:?}").to_lowercase(),
                (None, None, None) => "-".into(),
            };
            for e in &d.policy_errors {
                health += &format!("; cannot load {}@{}: {}", e.name, e.version, e.error);
            }
            let policies: Vec<String> = d.policies.iter().map(|p| format!("{}@{}", p.name, p.version)).collect();
            let (disk, backlog) = d.storage.as_ref().map(show_storage).unwrap_or_else(|| ("-".into(), "-".into()));
            vec![
                d.node_id,
                show_labels(&d.labels),
                d.location.as_ref().map(|l| l.to_string()).unwrap_or_else(|| "-".into()),
                applied,
                if policies.is_empty() { "-".into() } else { policies.join(",") },
                health,
                disk,
                backlog,
                show_opt_ms(d.last_seen_ms),
                show_ms(d.cert_not_after_ms),
            ]
        })
        .collect();
    table(
        &[
            "NODE",
            "LABELS",
            "LOCATION",
            "GENERATION",
            "POLICIES",
            "HEALTH",
            "DISK FREE",
            "EXPORT BACKLOG",
            "LAST SEEN",
            "CERT EXPIRES",
        ],
        rows,
    );
    Ok(())
}

/// A device's disk (free MiB and share, and each class near or at its quota) and export
/// backlog, as the device list shows them.
fn show_storage(s: &StorageStatus) -> (String, String) {
    let mut disk = match s.disk_size_bytes {
        0 => "-".to_string(),
        size => {
            format!("{} MiB ({}%)", s.disk_available_bytes >> 20, s.disk_available_bytes.saturating_mul(100) / size)
        }
    };
    for c in &s.classes {
        let used = c.used_bytes.saturating_mul(100) / c.quota_bytes.max(1);
        if c.refusing || used >= 80 {
            disk += &format!("; {} {used}% of quota{}", c.class, if c.refusing { ", refusing" } else { "" });
        }
    }
    let mut backlog = match (s.export_pending_blocks, s.export_failed_rounds) {
        (0, 0) => "-".to_string(),
        (blocks, 0) => format!("{blocks} blocks"),
        (blocks, failed) => format!("{blocks} blocks, {failed} rounds failed"),
    };
    if s.export_pending_bytes > 0 {
        backlog += &format!(", {} MiB", s.export_pending_bytes.div_ceil(1 << 20));
    }
    if s.export_oldest_due_ms > 0 {
        let behind = u64::try_from(now_ms()).unwrap_or(0).saturating_sub(s.export_oldest_due_ms) / 1000;
        backlog += &format!(", {behind} s behind");
    }
    (disk, backlog)
}

/// `device ...`.
#[derive(Debug, clap::Subcommand)]
pub enum DeviceCommand {
    /// Revoke a device's certificate (operator): the control plane refuses it at once, and its
    /// id reaches every node's revocation list with the next watch answer.
    #[command(after_help = "Example:\n  timeshard-control device revoke 3f2a9c... --reason \"stolen from rack 3\"")]
    Revoke {
        /// Node id, as `devices` lists it.
        node_id: String,
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        conn: Connection,
    },
    /// Set or clear where a device is (operator). The node gets it with its next watch answer,
    /// gossips it, and context-of-interest classes place data by it; it wins over a `location`
    /// in the node's own file. Selectors by --geohash match the new location from then on.
    #[command(after_help = "Examples:\n  timeshard-control device set-location 3f2a9c... 33.75,-84.39\n  \
                      timeshard-control device set-location 3f2a9c... --clear")]
    SetLocation {
        /// Node id, as `devices` lists it.
        node_id: String,
        /// LAT,LON in degrees.
        #[arg(value_name = "LAT,LON", allow_hyphen_values = true, required_unless_present = "clear")]
        location: Option<Location>,
        /// Remove the device's location (the node then holds no context-of-interest replicas,
        /// unless its own file gives one).
        #[arg(long, conflicts_with = "location")]
        clear: bool,
        #[command(flatten)]
        conn: Connection,
    },
}

pub async fn device(cmd: DeviceCommand) -> anyhow::Result<()> {
    match cmd {
        DeviceCommand::Revoke { node_id, reason, conn } => {
            let path = format!("{}/{node_id}/revoke", paths::DEVICES);
            let changed: Changed = Client::new(&conn)?.send(Method::POST, &path, &RevokeDevice { reason }).await?;
            eprintln!("node {node_id} revoked; generation {}", changed.generation);
            Ok(())
        }
        DeviceCommand::SetLocation { node_id, location, clear: _, conn } => {
            let path = format!("{}/{node_id}/location", paths::DEVICES);
            let req = SetDeviceLocation { location };
            let changed: Changed = Client::new(&conn)?.send(Method::PUT, &path, &req).await?;
            match &req.location {
                Some(l) => eprintln!("node {node_id} is at {l} ({}); generation {}", l.geohash, changed.generation),
                None => eprintln!("node {node_id} has no location now; generation {}", changed.generation),
            }
            Ok(())
        }
    }
}

/// `audit`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  timeshard-control audit --limit 20\n  timeshard-control audit --json --limit 1000 > audit.json"
)]
pub struct AuditArgs {
    /// Most entries (newest first).
    #[arg(long, default_value_t = 50)]
    limit: u32,
    /// Entries older than this entry id (paging).
    #[arg(long)]
    before: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: Connection,
}

pub async fn audit(args: AuditArgs) -> anyhow::Result<()> {
    let mut path = format!("{}?limit={}", paths::AUDIT, args.limit);
    if let Some(before) = &args.before {
        path.push_str(&format!("&before={before}"));
    }
    let entries: Vec<AuditEntry> = Client::new(&args.conn)?.get(&path).await?;
    if args.json {
        return print_json(&entries);
    }
    let short = |v: &Option<serde_json::Value>| v.as_ref().map(|v| v.to_string()).unwrap_or_else(|| "-".into());
    let rows = entries
        .into_iter()
        .map(|e| vec![show_ms(e.at_ms), e.actor, e.action, e.target, short(&e.before), short(&e.after)])
        .collect();
    table(&["WHEN", "WHO", "WHAT", "TARGET", "BEFORE", "AFTER"], rows);
    Ok(())
}

/// `fleet`.
#[derive(Debug, clap::Args)]
pub struct FleetArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: Connection,
}

pub async fn fleet(args: FleetArgs) -> anyhow::Result<()> {
    let info: FleetInfo = Client::new(&args.conn)?.get(paths::FLEET).await?;
    if args.json {
        return print_json(&info);
    }
    println!("CA fingerprint  {}", info.ca_fingerprint);
    println!("generation      {}", info.generation);
    println!("digest          {}", info.digest);
    Ok(())
}
