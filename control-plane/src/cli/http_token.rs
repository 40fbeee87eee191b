//! `http-token ...`: tokens for the nodes' HTTP side (InfluxDB line protocol, Prometheus,
//! queries). Nodes receive the token's id and hash with their desired state and accept it within
//! a propagation; revoking it reaches them the same way.

use std::collections::BTreeMap;
use std::time::Duration;

use http::Method;
use timeshard_control_api::api::{Changed, CreateHttpToken, HttpTokenInfo, TokenCreated, paths};
use timeshard_control_api::state::Selector;

use super::admin::{labels_arg, print_json, show_opt_ms, table};
use super::client::{Client, Connection};

const EXAMPLES: &str = "\
Examples:
  timeshard-control http-token create --name telegraf
  timeshard-control http-token create --name grafana-atl --select site=atl --expires 90d
  timeshard-control http-token create --name gateway --geohash dn5
  timeshard-control http-token list
  timeshard-control http-token revoke 0123456789abcdef

Clients send it as `Authorization: Bearer <token>` (or `Token <token>`, or as the password of
InfluxDB 1.x clients). A node that has any token, configured in [http] tokens or issued here,
refuses requests without one.";

#[derive(Debug, clap::Subcommand)]
#[command(after_help = EXAMPLES)]
pub enum HttpTokenCommand {
    /// Create a token the selected nodes accept (operator); prints only the token on standard output.
    #[command(after_help = EXAMPLES)]
    Create {
        /// Who or what uses it (shown in lists, node logs and the audit log).
        #[arg(long)]
        name: String,
        /// Labels a node must have to accept it: key=value,key=value (none: every node).
        #[arg(long, value_parser = labels_arg, default_value = "")]
        select: BTreeMap<String, String>,
        /// Geohash prefix the node's location must have (e.g. dn5 for Atlanta).
        #[arg(long)]
        geohash: Option<String>,
        /// Expiry (e.g. 90d); none by default.
        #[arg(long, value_parser = humantime::parse_duration)]
        expires: Option<Duration>,
        #[command(flatten)]
        conn: Connection,
    },
    /// List HTTP tokens (viewer).
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Connection,
    },
    /// Revoke an HTTP token by id (operator): nodes refuse it once they apply the change.
    Revoke {
        id: String,
        #[command(flatten)]
        conn: Connection,
    },
}

pub async fn run(cmd: HttpTokenCommand) -> anyhow::Result<()> {
    match cmd {
        HttpTokenCommand::Create { name, select, geohash, expires, conn } => {
            let req = CreateHttpToken {
                name,
                selector: Selector { labels: select, geohash },
                expires_in_s: expires.map(|d| d.as_secs().max(1)),
            };
            let created: TokenCreated = Client::new(&conn)?.send(Method::POST, paths::HTTP_TOKENS, &req).await?;
            println!("{}", created.token);
            eprintln!(
                "HTTP token {} created; it is shown this once. Nodes accept it once they apply the new generation.",
                created.id
            );
            Ok(())
        }
        HttpTokenCommand::List { json, conn } => {
            let tokens: Vec<HttpTokenInfo> = Client::new(&conn)?.get(paths::HTTP_TOKENS).await?;
            if json {
                return print_json(&tokens);
            }
            let rows = tokens
                .into_iter()
                .map(|t| {
                    let state = if t.revoked_at_ms.is_some() { "revoked" } else { "active" };
                    vec![t.id, t.name, t.selector.to_string(), show_opt_ms(t.expires_at_ms), state.into()]
                })
                .collect();
            table(&["ID", "NAME", "NODES", "EXPIRES", "STATE"], rows);
            Ok(())
        }
        HttpTokenCommand::Revoke { id, conn } => {
            let changed: Changed =
                Client::new(&conn)?.send(Method::DELETE, &format!("{}/{id}", paths::HTTP_TOKENS), &()).await?;
            eprintln!("HTTP token {id} revoked (generation {})", changed.generation);
            Ok(())
        }
    }
}
