//! From the control plane's desired state to a node configuration, without I/O.
//!
//! For what the desired state sets, it wins over the node's own file and flags: the TLS
//! identity (the enrollment's files in `<data_dir>/control`), the classes, the node's location
//! (when the control plane has one for the device), the bootstrap peers (when it names any)
//! and the per-node limits it sets. Everything else (listen address, data
//! directory, DHT, store, wire limits, policies) comes from the file and the flags.

use std::collections::HashSet;
use std::path::Path;

use timeshard_control_api::files::{CA_FILE, CERT_FILE, KEY_FILE};
use timeshard_control_api::state::{LimitSettings, fleet_digest};
use timeshard_control_api::{ClassSpec, DesiredState};
use timeshard_proto::Id;

use crate::config::{ClassConfig, ConfigError, LimitsConfig, NodeConfig, TlsConfig};

/// A class as the node configures it, from the control plane's.
pub fn class_config(spec: &ClassSpec) -> ClassConfig {
    ClassConfig {
        name: spec.name.clone(),
        metric_prefix: spec.metric_prefix.clone(),
        format: spec.format,
        quantum: spec.quantum,
        rf: spec.rf,
        w: spec.w,
        r: spec.r,
        retention: spec.retention,
        hot: spec.hot,
        archive: spec.archive,
        export_priority: spec.export_priority,
        age_by: spec.age_by,
        coi: spec.coi.clone(),
        quota: spec.quota,
        on_full: spec.on_full,
    }
}

/// A class as the control plane describes it, from the node's.
pub fn class_spec(class: &ClassConfig) -> ClassSpec {
    ClassSpec {
        name: class.name.clone(),
        metric_prefix: class.metric_prefix.clone(),
        format: class.format,
        quantum: class.quantum,
        rf: class.rf,
        w: class.w,
        r: class.r,
        retention: class.retention,
        hot: class.hot,
        archive: class.archive,
        export_priority: class.export_priority,
        age_by: class.age_by,
        coi: class.coi.clone(),
        quota: class.quota,
        on_full: class.on_full,
    }
}

fn overlay_limits(limits: &mut LimitsConfig, set: &LimitSettings) {
    let pick = |slot: &mut usize, value: Option<u32>| {
        if let Some(v) = value {
            *slot = v as usize;
        }
    };
    pick(&mut limits.max_concurrent_requests, set.max_concurrent_requests);
    pick(&mut limits.max_connections, set.max_connections);
    pick(&mut limits.read_parallelism, set.read_parallelism);
    pick(&mut limits.max_quanta_per_page, set.max_quanta_per_page);
}

/// The configuration a node enrolled with its files in `control_dir` runs under `desired`,
/// starting from `base` (its file and flags). Checked whole.
pub fn effective_config(
    base: &NodeConfig,
    control_dir: &Path,
    desired: &DesiredState,
) -> Result<NodeConfig, ConfigError> {
    let mut config = base.clone();
    config.tls =
        TlsConfig { ca: control_dir.join(CA_FILE), cert: control_dir.join(CERT_FILE), key: control_dir.join(KEY_FILE) };
    config.classes = desired.classes.iter().map(class_config).collect();
    if !desired.bootstrap.is_empty() {
        config.bootstrap = desired.bootstrap.clone();
    }
    if let Some(at) = &desired.location {
        at.validate().map_err(|e| ConfigError::Invalid { setting: "location".into(), message: e.to_string() })?;
        config.location = Some(at.to_string());
    }
    overlay_limits(&mut config.limits, &desired.limits);
    config.http.issued_tokens = true;
    config.validate()?;
    Ok(config)
}

/// The digest of what every node of a fleet must agree on, as the control plane computes it
/// ([`fleet_digest`]: SHA-256, hex, of the classes and the revoked node ids). A node computes
/// it from what it runs, so it matches the desired state's digest only when the node really
/// runs that.
pub fn config_digest(classes: &[ClassConfig], revoked: &HashSet<Id>) -> String {
    let specs: Vec<ClassSpec> = classes.iter().map(class_spec).collect();
    let revoked: Vec<String> = revoked.iter().map(Id::to_hex).collect();
    fleet_digest(&specs, &revoked)
}

/// The first 64 bits of a hex digest (0 when it is not hex).
pub fn digest_prefix(hex: &str) -> u64 {
    hex.get(..16).and_then(|h| u64::from_str_radix(h, 16).ok()).unwrap_or(0)
}

/// [`config_digest`], first 64 bits: what `timeshard status` shows and nodes exchange.
pub fn config_digest_u64(classes: &[ClassConfig], revoked: &HashSet<Id>) -> u64 {
    digest_prefix(&config_digest(classes, revoked))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use timeshard_control_api::FleetState;
    use timeshard_control_api::state::{NodeConfigEntry, NodeSettings, Selector};

    use super::*;

    fn desired() -> DesiredState {
        let mut pmu = ClassSpec::new("pmu", "pmu.");
        pmu.retention = Some(Duration::from_secs(86_400));
        pmu.rf = 1;
        pmu.w = 1;
        pmu.r = 1;
        let mut settings = NodeSettings { bootstrap: Some(vec!["10.0.0.5:7400".into()]), ..Default::default() };
        settings.limits.set("read_parallelism", 8).unwrap();
        let entry = NodeConfigEntry { name: "all".into(), selector: Selector::default(), priority: 0, settings };
        let revoked = vec![Id([7; 20]).to_hex()];
        FleetState::new(9, vec![pmu, ClassSpec::new("env", "env.")], vec![entry], revoked).for_node(
            "n",
            &Default::default(),
            None,
        )
    }

    #[test]
    fn desired_state_wins_where_it_speaks() {
        let mut base = NodeConfig { bootstrap: vec!["own:1".into()], ..NodeConfig::default() };
        base.limits.max_connections = 77;
        base.classes.push(ClassConfig { name: "file".into(), metric_prefix: "file.".into(), ..Default::default() });
        let desired = desired();
        let cfg = effective_config(&base, Path::new("/d/control"), &desired).unwrap();
        assert_eq!(cfg.tls.cert, Path::new("/d/control/node.pem"));
        assert_eq!(cfg.tls.key, Path::new("/d/control/node.key"));
        assert_eq!(cfg.tls.ca, Path::new("/d/control/ca.pem"));
        assert_eq!(cfg.classes.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["env", "pmu"]);
        assert_eq!(cfg.bootstrap, ["10.0.0.5:7400"]);
        assert_eq!((cfg.limits.read_parallelism, cfg.limits.max_connections), (8, 77));
        assert_eq!(cfg.listen, base.listen);
        // No bootstrap peers in the desired state: the node keeps its own.
        let mut quiet = desired.clone();
        quiet.bootstrap.clear();
        assert_eq!(effective_config(&base, Path::new("/d"), &quiet).unwrap().bootstrap, ["own:1"]);
        // A class table the node cannot run is refused whole.
        base.dht.k = 2;
        let mut wide = desired;
        wide.classes[0].rf = 3;
        assert!(effective_config(&base, Path::new("/d"), &wide).is_err());
    }

    #[test]
    fn digest_is_the_control_planes_when_the_node_runs_the_desired_state() {
        let desired = desired();
        let cfg = effective_config(&NodeConfig::default(), Path::new("/d"), &desired).unwrap();
        let revoked: HashSet<Id> = desired.revoked.iter().map(|s| s.parse().unwrap()).collect();
        assert_eq!(config_digest(&cfg.classes, &revoked), desired.digest);
        assert_eq!(config_digest_u64(&cfg.classes, &revoked), u64::from_str_radix(&desired.digest[..16], 16).unwrap());
        assert_ne!(config_digest(&cfg.classes, &HashSet::new()), desired.digest);
        assert_eq!(digest_prefix("zz"), 0);
    }

    #[test]
    fn coi_classes_and_the_location_come_from_the_control_plane() {
        let mut traffic = ClassSpec::new("traffic", "traffic.");
        traffic.coi = Some(
            timeshard_control_api::class::parse_coi(
                "n_in=2,n_out=1,in_coi_dist=50km,out_coi_dist=1000km,coi_size=50km,precision=5",
                None,
            )
            .unwrap(),
        );
        let atl: timeshard_control_api::Location = "33.75,-84.39".parse().unwrap();
        let desired = FleetState::new(4, vec![traffic], vec![], vec![]).for_node("n", &Default::default(), Some(&atl));
        // The control plane's location wins over the file's.
        let base = NodeConfig { location: Some("47.6,-122.3".into()), ..NodeConfig::default() };
        let cfg = effective_config(&base, Path::new("/d"), &desired).unwrap();
        assert_eq!(cfg.location().unwrap().map(|p| (p.lat, p.lon)), Some((33.75, -84.39)));
        let table = cfg.class_table().unwrap();
        let class = table.of(&"traffic.speed{geohash=dn5bpsb}".parse().unwrap());
        assert_eq!((class.replication.rf, class.coi.as_ref().unwrap().in_coi_m), (3, 50_000));
        assert_eq!(config_digest(&cfg.classes, &HashSet::new()), desired.digest);
        // Without one from the control plane, the file's stays.
        let quiet = FleetState::new(4, vec![], vec![], vec![]).for_node("n", &Default::default(), None);
        assert_eq!(effective_config(&base, Path::new("/d"), &quiet).unwrap().location, base.location);
        // A location whose geohash does not match its position is refused.
        let mut forged = desired;
        forged.location.as_mut().unwrap().geohash = "9q8yy".into();
        let err = effective_config(&base, Path::new("/d"), &forged).unwrap_err().to_string();
        assert!(err.contains("location") && err.contains("geohash"), "{err}");
    }
}
