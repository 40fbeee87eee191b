//! `policy ...` (upload, list, show, download) and `rollout ...` (start, status, promote, pause,
//! resume, rollback): the commands over the API's policy and rollout endpoints.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use http::Method;
use timeshard_control_api::api::paths;
use timeshard_control_api::policy::{
    PolicySettings, PolicyVersionInfo, RolloutAction, RolloutSpec, RolloutStatus, SeriesSelector, UploadQuery,
    Uploaded, parse_percent, parse_waves,
};
use timeshard_control_api::state::Selector;

use super::admin::{labels_arg, print_json, show_labels, show_opt_ms, table};
use super::client::{Client, Connection};
use crate::time::show_ms;

const POLICY_EXAMPLES: &str = "\
Examples:
  timeshard-control policy upload --name pmu-validate --version 1.3.0 --kind ingest pmu_validate.wasm
  timeshard-control policy list
  timeshard-control policy show pmu-validate
  timeshard-control policy download pmu-validate@1.3.0 --out pmu_validate.wasm   # and .wasm.sig

An upload is checked (a component of the kind's world, importing only the host's logging,
under 4 MiB), stored by its SHA-256 and signed with the fleet's policy key, which nodes trust.
A name and version always mean the same bytes.

Signing offline (the service started with --policy-public-key policy.pub signs nothing):
  timeshard-control policy keygen --out policy.key > policy.pub     # on the operator's machine
  timeshard-control policy sign --key policy.key --name pmu-validate --version 1.3.0 --kind ingest pmu_validate.wasm
  timeshard-control policy upload --name pmu-validate --version 1.3.0 --kind ingest \
      --signature pmu_validate.wasm.sig pmu_validate.wasm";

/// `policy ...`.
#[derive(Debug, clap::Subcommand)]
#[command(after_help = POLICY_EXAMPLES)]
pub enum PolicyCommand {
    /// Upload a policy module (operator): checked, stored and signed by the control plane.
    #[command(after_help = POLICY_EXAMPLES)]
    Upload {
        #[arg(long)]
        name: String,
        #[arg(long)]
        version: String,
        /// ingest or query.
        #[arg(long)]
        kind: String,
        /// Revoke the versions of this name below this one (a semantic version, at most
        /// --version): nodes that install this module refuse them from then on, even signed.
        #[arg(long, value_name = "VERSION")]
        min_version: Option<String>,
        /// The module's offline signature (`policy sign`), for a service started with
        /// --policy-public-key.
        #[arg(long, value_name = "FILE")]
        signature: Option<PathBuf>,
        /// The component (.wasm).
        module: PathBuf,
        #[command(flatten)]
        conn: Connection,
    },
    /// List uploaded versions: hashes, uploaders, and how many nodes run each.
    List {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Connection,
    },
    /// Show one policy's versions and the nodes that run each.
    Show {
        name: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Connection,
    },
    /// Offline signing, on an operator's machine (not the service's): `keygen`, `sign`.
    #[command(flatten)]
    Signing(timeshard_policy::commands::SigningCommand),
    /// Write a version's module and its signature (MODULE.sig) to files, e.g. for nodes that
    /// are configured by hand.
    Download {
        /// NAME@VERSION.
        policy: String,
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        conn: Connection,
    },
}

fn version_rows(versions: &[PolicyVersionInfo], nodes_listed: bool) -> Vec<Vec<String>> {
    versions
        .iter()
        .map(|v| {
            let runs = if nodes_listed && !v.nodes.is_empty() {
                v.nodes.iter().map(|n| n.chars().take(12).collect::<String>()).collect::<Vec<_>>().join(",")
            } else {
                format!("{} node(s)", v.nodes.len())
            };
            vec![
                v.name.clone(),
                v.version.clone(),
                v.kind.to_string(),
                v.sha256.chars().take(16).collect(),
                v.size.to_string(),
                v.uploaded_by.clone(),
                show_ms(v.uploaded_at_ms),
                runs,
            ]
        })
        .collect()
}

const VERSION_HEADER: [&str; 8] = ["NAME", "VERSION", "KIND", "SHA256", "BYTES", "UPLOADED BY", "UPLOADED", "RUNS ON"];

fn split_policy(text: &str) -> anyhow::Result<(String, String)> {
    let (name, version) =
        text.split_once('@').with_context(|| format!("{text:?} must be NAME@VERSION, e.g. pmu-validate@1.3.0"))?;
    Ok((name.to_string(), version.to_string()))
}

pub async fn policy(cmd: PolicyCommand) -> anyhow::Result<()> {
    match cmd {
        PolicyCommand::Signing(cmd) => Ok(timeshard_policy::commands::run(cmd)?),
        PolicyCommand::Upload { name, version, kind, min_version, signature, module, conn } => {
            let bytes = std::fs::read(&module).with_context(|| format!("cannot read {}", module.display()))?;
            let mut path = format!("{}?name={name}&version={version}&kind={kind}", paths::POLICIES);
            if let Some(min) = &min_version {
                path.push_str(&format!("&min_version={min}"));
            }
            if let Some(file) = &signature {
                let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
                path.push_str(&format!("&signature={}", UploadQuery::encode_signature(&text)));
            }
            let up: Uploaded = Client::new(&conn)?.send_bytes(Method::POST, &path, bytes).await?;
            let p = &up.policy;
            if up.created {
                let by =
                    if signature.is_some() { "its offline signature checked" } else { "signed by the fleet's key" };
                println!("uploaded {}@{} ({} policy), sha256 {}, {by}", p.name, p.version, p.kind, p.sha256);
            } else {
                println!("{}@{} was already uploaded with these bytes (sha256 {})", p.name, p.version, p.sha256);
            }
            eprintln!(
                "roll it out with: timeshard-control rollout start {}@{} --select LABELS --waves 100%",
                p.name, p.version
            );
            Ok(())
        }
        PolicyCommand::List { json, conn } => {
            let versions: Vec<PolicyVersionInfo> = Client::new(&conn)?.get(paths::POLICIES).await?;
            if json {
                return print_json(&versions);
            }
            table(&VERSION_HEADER, version_rows(&versions, false));
            Ok(())
        }
        PolicyCommand::Show { name, json, conn } => {
            let versions: Vec<PolicyVersionInfo> =
                Client::new(&conn)?.get(&format!("{}/{name}", paths::POLICIES)).await?;
            if json {
                return print_json(&versions);
            }
            table(&VERSION_HEADER, version_rows(&versions, true));
            Ok(())
        }
        PolicyCommand::Download { policy, out, conn } => {
            let (name, version) = split_policy(&policy)?;
            let client = Client::new(&conn)?;
            let bytes = client.get_bytes(&format!("{}/{name}/{version}/module", paths::POLICIES)).await?;
            let versions: Vec<PolicyVersionInfo> = client.get(&format!("{}/{name}", paths::POLICIES)).await?;
            let info = versions.iter().find(|v| v.version == version).context("the version vanished")?;
            std::fs::write(&out, &bytes).with_context(|| format!("cannot write {}", out.display()))?;
            let sig = timeshard_policy::signing::signature_path(&out);
            std::fs::write(&sig, &info.signature).with_context(|| format!("cannot write {}", sig.display()))?;
            println!("wrote {} and {}", out.display(), sig.display());
            Ok(())
        }
    }
}

const ROLLOUT_EXAMPLES: &str = "\
Examples:
  # v1.3.0 to Atlanta: one canary node first, then a quarter, then every node; abort (and go
  # back to the version each node ran) when more than 5% of its calls fail.
  timeshard-control rollout start pmu-validate@1.3.0 --select site=atl --series pmu. \\
      --canary 1 --waves 25%,100% --abort-above 5%
  timeshard-control rollout status pmu-validate
  timeshard-control rollout promote pmu-validate     # next stage; the last one completes it
  timeshard-control rollout pause pmu-validate       # no promotion until resumed
  timeshard-control rollout rollback pmu-validate --reason \"too many rejections\"

Every node the selector picks when the rollout starts is a target; a node that joins the
selector later runs the stable version until the rollout completes. Nodes offline during a
rollout get the right version when they are back.";

/// `rollout ...`.
#[derive(Debug, clap::Subcommand)]
#[command(after_help = ROLLOUT_EXAMPLES)]
pub enum RolloutCommand {
    /// Start a staged rollout of NAME@VERSION (operator).
    #[command(after_help = ROLLOUT_EXAMPLES)]
    Start {
        /// NAME@VERSION, uploaded before.
        policy: String,
        /// Devices by labels: key=value,key=value (none: every device).
        #[arg(long, value_parser = labels_arg, default_value = "")]
        select: BTreeMap<String, String>,
        /// Devices by geohash prefix of their location.
        #[arg(long)]
        geohash: Option<String>,
        /// Series on those devices: metric prefix (empty: every metric).
        #[arg(long, default_value = "")]
        series: String,
        /// Series on those devices: tags they must have, key=value,key=value.
        #[arg(long, value_parser = labels_arg, default_value = "")]
        tags: BTreeMap<String, String>,
        /// A value given to the policy with every call, NAME=VALUE (repeat for several).
        #[arg(long = "config", value_name = "NAME=VALUE")]
        config: Vec<String>,
        /// Store a batch unprocessed when the ingest policy fails (default: refuse it).
        #[arg(long)]
        pass_through: bool,
        /// Deadline of each call in milliseconds (default: the node's, 10 ms).
        #[arg(long)]
        deadline_ms: Option<u64>,
        /// Memory cap of each call in MiB (default and most: the node's, 64 MiB).
        #[arg(long)]
        memory_mib: Option<u64>,
        /// Nodes of the first stage (0: none).
        #[arg(long, default_value_t = 1)]
        canary: u32,
        /// Shares of the targets the next stages reach, the last 100%: e.g. 25%,100%.
        #[arg(long, default_value = "100%")]
        waves: String,
        /// Abort automatically when more than this share of calls fails.
        #[arg(long, default_value = "5%", value_parser = parse_percent)]
        abort_above: f64,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Connection,
    },
    /// Show a policy's latest rollout: stage, and every targeted node with its version and counts.
    Status {
        name: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Connection,
    },
    /// Reach the next stage (the last one completes the rollout).
    Promote(ActionArgs),
    /// Stop promotion until resumed (failures are still watched).
    Pause(ActionArgs),
    /// Allow promotion again.
    Resume(ActionArgs),
    /// Go back: every targeted node runs the version it ran before.
    Rollback(ActionArgs),
}

/// Arguments of promote, pause, resume and rollback.
#[derive(Debug, clap::Args)]
pub struct ActionArgs {
    /// The policy's name.
    pub name: String,
    /// Why (recorded in the audit log).
    #[arg(long)]
    pub reason: Option<String>,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: Connection,
}

fn print_status(s: &RolloutStatus) {
    let stage =
        s.stages.get(s.stage as usize).map_or("-".to_string(), |st| format!("{} ({} nodes)", st.label, st.nodes));
    let stages: Vec<String> = s.stages.iter().map(|st| format!("{} ({})", st.label, st.nodes)).collect();
    println!(
        "rollout {}: {}@{} ({} policy) to {} for {}",
        s.id, s.spec.policy, s.spec.version, s.kind, s.spec.selector, s.spec.series
    );
    println!("state {}, stage {stage}; stages {}", s.state, stages.join(" -> "));
    println!(
        "abort above {}% failed calls; started by {} at {}",
        s.spec.abort_above_pct,
        s.created_by,
        show_ms(s.created_at_ms)
    );
    if let Some(reason) = &s.reason {
        println!("reason: {reason}");
    }
    let rows = s
        .nodes
        .iter()
        .map(|n| {
            let stage = match n.stage {
                Some(i) => s.stages.get(i as usize).map_or(i.to_string(), |st| st.label.clone()),
                None => "joined later".into(),
            };
            vec![
                n.node_id.clone(),
                show_labels(&n.labels),
                stage,
                n.desired.clone().unwrap_or_else(|| "-".into()),
                n.running.clone().unwrap_or_else(|| "-".into()),
                n.calls.to_string(),
                n.failed_calls.to_string(),
                n.load_error.clone().unwrap_or_default(),
                show_opt_ms(n.last_seen_ms),
            ]
        })
        .collect();
    table(&["NODE", "LABELS", "STAGE", "DESIRED", "RUNNING", "CALLS", "FAILED", "LOAD ERROR", "LAST SEEN"], rows);
}

fn settings_of(config: &[String], pass_through: bool) -> anyhow::Result<PolicySettings> {
    let mut settings = PolicySettings { pass_through, ..Default::default() };
    for c in config {
        let (k, v) = c.split_once('=').with_context(|| format!("--config {c:?} must be NAME=VALUE"))?;
        settings.config.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(settings)
}

pub async fn rollout(cmd: RolloutCommand) -> anyhow::Result<()> {
    let (status, json): (RolloutStatus, bool) = match cmd {
        RolloutCommand::Start {
            policy,
            select,
            geohash,
            series,
            tags,
            config,
            pass_through,
            deadline_ms,
            memory_mib,
            canary,
            waves,
            abort_above,
            json,
            conn,
        } => {
            let (policy, version) = split_policy(&policy)?;
            let spec = RolloutSpec {
                policy,
                version,
                selector: Selector { labels: select, geohash },
                series: SeriesSelector { metric_prefix: series, tags },
                settings: PolicySettings { deadline_ms, memory_mib, ..settings_of(&config, pass_through)? },
                canary,
                waves: parse_waves(&waves).map_err(anyhow::Error::msg)?,
                abort_above_pct: abort_above,
            };
            (Client::new(&conn)?.send(Method::POST, paths::ROLLOUTS, &spec).await?, json)
        }
        RolloutCommand::Status { name, json, conn } => {
            (Client::new(&conn)?.get(&format!("{}/{name}", paths::ROLLOUTS)).await?, json)
        }
        RolloutCommand::Promote(a) => (act(a.name.clone(), "promote", &a).await?, a.json),
        RolloutCommand::Pause(a) => (act(a.name.clone(), "pause", &a).await?, a.json),
        RolloutCommand::Resume(a) => (act(a.name.clone(), "resume", &a).await?, a.json),
        RolloutCommand::Rollback(a) => (act(a.name.clone(), "rollback", &a).await?, a.json),
    };
    if json {
        return print_json(&status);
    }
    print_status(&status);
    Ok(())
}

async fn act(name: String, action: &str, args: &ActionArgs) -> anyhow::Result<RolloutStatus> {
    let path = format!("{}/{name}/{action}", paths::ROLLOUTS);
    Client::new(&args.conn)?.send(Method::POST, &path, &RolloutAction { reason: args.reason.clone() }).await
}
