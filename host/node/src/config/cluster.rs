//! Keeping replicas in step: `[membership]` (gossip, when a silent node is down or gone),
//! `[hints]` (writes a replica missed) and `[repair]` (anti-entropy, handoff, read repair).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The membership view: gossip and when a silent node counts as down or gone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MembershipConfig {
    /// How often this node bumps its heartbeat and gossips with a few peers.
    #[serde(with = "humantime_serde")]
    pub gossip_interval: Duration,
    /// A node whose heartbeat did not advance for this long is down: writes to it become hints.
    #[serde(with = "humantime_serde")]
    pub suspect_after: Duration,
    /// A node silent for this long is gone: it no longer owns blocks, and the next closest
    /// nodes take over.
    #[serde(with = "humantime_serde")]
    pub gone_after: Duration,
    /// Most nodes the view holds.
    pub max_members: usize,
    /// How far ahead of this node's clock a peer's incarnation (its start time) may be; a
    /// signed entry later than that is refused, so no version gets out of reach of refutation.
    #[serde(with = "humantime_serde")]
    pub max_clock_skew: Duration,
}

impl Default for MembershipConfig {
    fn default() -> Self {
        let d = timeshard_proto::membership::Config::default();
        MembershipConfig {
            gossip_interval: Duration::from_secs(1),
            suspect_after: d.suspect_after,
            gone_after: d.gone_after,
            max_members: d.max_members,
            max_clock_skew: Duration::from_secs(300),
        }
    }
}

impl MembershipConfig {
    /// The settings of the sans-IO view.
    pub fn view(&self) -> timeshard_proto::membership::Config {
        timeshard_proto::membership::Config {
            suspect_after: self.suspect_after,
            gone_after: self.gone_after,
            max_members: self.max_members,
            ..timeshard_proto::membership::Config::default()
        }
    }
}

/// Hinted handoff: writes a replica missed, kept by the coordinator in `<data_dir>/hints`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HintsConfig {
    /// Hints older than this are dropped (anti-entropy repairs what they held).
    #[serde(with = "humantime_serde")]
    pub max_age: Duration,
    /// Most bytes of hints kept; a hint beyond it is dropped.
    pub max_bytes: u64,
    /// Bytes per second replayed to replicas that are back (message bytes as framed on the
    /// wire).
    pub replay_bytes_per_sec: u64,
    /// Writes to replicas that may still run after their write was answered; beyond it they
    /// become hints.
    pub max_replica_writes: usize,
}

impl Default for HintsConfig {
    fn default() -> Self {
        HintsConfig {
            max_age: Duration::from_secs(3 * 3600),
            max_bytes: 256 << 20,
            replay_bytes_per_sec: 16 << 20,
            max_replica_writes: 256,
        }
    }
}

/// Anti-entropy, handoff of displaced blocks, and read repair.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RepairConfig {
    /// How often a node pulls from each of its neighbours (every member when the view holds
    /// at most 64, else the 64 closest), jittered by up to a tenth. A change of the view
    /// starts a round at once.
    #[serde(with = "humantime_serde")]
    pub anti_entropy_interval: Duration,
    /// Blocks written within this long are left out of comparisons (live ingest keeps
    /// replicas briefly apart; hints and read repair cover them), and a displaced block is
    /// handed off once it was not written for this long.
    #[serde(with = "humantime_serde")]
    pub settle_for: Duration,
    /// How long after a change that may have given this node blocks (its start, a member
    /// gone, left or leaving) its catch-up round starts: long enough for the change to reach
    /// every coordinator and for the writes placed by the previous view to end. Until that
    /// round has pulled from every neighbour, this node answers reads as unsettled.
    #[serde(with = "humantime_serde")]
    pub catch_up_delay: Duration,
    /// Most bytes per second anti-entropy fetches and handoff pushes, each: message bytes as
    /// framed on the wire (QUIC packet headers not counted).
    pub bytes_per_sec: u64,
    /// Read repairs waiting to be sent, at most; more are dropped and counted (anti-entropy
    /// repairs them later).
    pub read_repair_queue: usize,
}

impl Default for RepairConfig {
    fn default() -> Self {
        RepairConfig {
            anti_entropy_interval: Duration::from_secs(60),
            settle_for: Duration::from_secs(30),
            catch_up_delay: Duration::from_secs(15),
            bytes_per_sec: 64 << 20,
            read_repair_queue: 1_024,
        }
    }
}
