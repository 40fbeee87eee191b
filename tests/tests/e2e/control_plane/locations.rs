//! Context of interest through the control plane: classes carry their CoI parameters (checked
//! as a node's file checks them), and an operator sets where each device is; both reach the
//! devices in their desired state.

use http::Method;
use timeshard_control_api::api::{
    AuditEntry, Changed, CreateApiToken, DeviceInfo, PutClasses, SetDeviceLocation, TokenCreated, paths,
};
use timeshard_control_api::class::parse_coi;
use timeshard_control_api::{ClassSpec, Location};

use super::scenarios::watch_to;
use super::{TestFleet, client_code};

const COI: &str = "n_in=2,n_out=1,in_coi_dist=50km,out_coi_dist=1000km,coi_size=50km,precision=5";

fn location_path(node_id: &str) -> String {
    format!("{}/{node_id}/location", paths::DEVICES)
}

async fn device(fleet: &TestFleet, node_id: &str) -> DeviceInfo {
    let devices: Vec<DeviceInfo> = fleet.admin.get(paths::DEVICES).await.unwrap();
    devices.into_iter().find(|d| d.node_id == node_id).expect("an enrolled device")
}

pub async fn coi_and_locations(fleet: &TestFleet) {
    // One device enrolled with a location (the token's), one without.
    let atl = fleet.enroll(0, "coi-atl", "site=atl").await;
    let token = fleet.token("site=sfo", None, 600).await;
    let sfo = timeshard_control_api::agent::enroll(fleet.url(1), &token, &fleet.device_dir("coi-sfo")).await.unwrap();
    assert!(sfo.applied().location.is_none());

    // A CoI class through the API reaches every device, parameters and all.
    let mut traffic = ClassSpec::new("traffic", "traffic.");
    traffic.coi = Some(parse_coi(COI, None).unwrap());
    let changed: Changed =
        fleet.admin.send(Method::PUT, paths::CLASSES, &PutClasses { classes: vec![traffic.clone()] }).await.unwrap();
    let a = watch_to(atl.client(), atl.applied().generation, changed.generation).await;
    let got = a.classes.iter().find(|c| c.name == "traffic").expect("the class");
    assert_eq!(got.coi, traffic.coi);
    assert!(a.location.as_ref().is_some_and(|l| l.geohash.starts_with("dn5")), "the token's location: {a:?}");

    // Parameters that cannot work are refused with the node's messages; nothing changes.
    for (bad, expect) in [
        ("n_in=0", "n_in must be at least 1"),
        ("out_coi_dist=10km", "out_coi_dist"),
        ("precision=13", "precision"),
        ("in_coi_dist=far", "coi.in_coi_dist"),
    ] {
        let mut class = traffic.clone();
        class.coi = Some(parse_coi(bad, traffic.coi.as_ref()).unwrap());
        let err = fleet
            .admin
            .send::<_, Changed>(Method::PUT, paths::CLASSES, &PutClasses { classes: vec![class] })
            .await
            .unwrap_err();
        assert_eq!(client_code(&err).as_deref(), Some("class_invalid"), "{bad}: {err}");
        assert!(err.to_string().contains(expect), "{bad}: {err}");
    }
    assert_eq!(fleet.fleet_info().await.generation, changed.generation, "refused changes make no generation");

    // The CLI: change one parameter; a new CoI must be complete; the table shows it.
    let (ok, _, err) = fleet.cli(&["class", "set", "traffic", "--coi", "in_coi_dist=80km"]).await;
    assert!(ok, "{err}");
    let (ok, _, err) = fleet.cli(&["class", "set", "parking", "--prefix", "parking.", "--coi", "n_in=2"]).await;
    assert!(!ok && err.contains("in_coi_dist") && err.contains("precision"), "{err}");
    let (ok, _, err) = fleet.cli(&["class", "set", "traffic", "--coi", "n_in=2,n_out=1,out_coi_dist=1km"]).await;
    assert!(!ok && err.contains("out_coi_dist"), "{err}");
    let (ok, out, err) = fleet.cli(&["class", "list"]).await;
    assert!(ok && out.contains("in 2 within 80km, out 1 beyond 1000km") && out.contains("3/2/1"), "{out} {err}");

    // An operator places the device without a location; it gets it with the next answer.
    let sfo_id = sfo.node_id().to_string();
    let (ok, _, err) = fleet.cli(&["device", "set-location", &sfo_id, "37.77,-122.42"]).await;
    assert!(ok && err.contains("9q8yy"), "{err}");
    let s = watch_to(sfo.client(), sfo.applied().generation, fleet.fleet_info().await.generation).await;
    let at = s.location.expect("the location set");
    assert_eq!((at.lat, at.lon), (37.77, -122.42));
    assert_eq!(device(fleet, &sfo_id).await.location, Some(at.clone()));
    let (ok, out, _) = fleet.cli(&["devices"]).await;
    assert!(ok && out.contains("37.77,-122.42") && out.contains("LOCATION"), "{out}");
    let entry = fleet
        .admin
        .get::<Vec<AuditEntry>>(&format!("{}?limit=5", paths::AUDIT))
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.action == "device.location")
        .expect("audited");
    assert_eq!((entry.target.as_str(), entry.before.unwrap()["location"].is_null()), (sfo_id.as_str(), true));
    // Selectors by geohash see the new location.
    let (ok, _, err) = fleet.cli(&["node-config", "set", "bay", "--geohash", "9q8"]).await;
    assert!(ok && err.contains("selects 1 device"), "{err}");

    // The same location again makes no generation; clearing it does.
    let same = SetDeviceLocation { location: Some(at) };
    let before = fleet.fleet_info().await.generation;
    let changed: Changed = fleet.admin.send(Method::PUT, &location_path(&sfo_id), &same).await.unwrap();
    assert_eq!(changed.generation, before);
    let (ok, _, err) = fleet.cli(&["device", "set-location", &sfo_id, "--clear"]).await;
    assert!(ok, "{err}");
    let s = watch_to(sfo.client(), s.generation, before + 1).await;
    assert!(s.location.is_none());

    // Bad input: coordinates out of range (refused by the CLI), a forged geohash, an unknown
    // device, no location and no --clear; a viewer cannot move devices.
    let (ok, _, err) = fleet.cli(&["device", "set-location", &sfo_id, "95,0"]).await;
    assert!(!ok && err.contains("latitude"), "{err}");
    let (ok, _, err) = fleet.cli(&["device", "set-location", &sfo_id]).await;
    assert!(!ok && err.contains("<LAT,LON>"), "{err}");
    let mut forged: Location = "33.75,-84.39".parse().unwrap();
    forged.geohash = "9q8yyk8yt".into();
    let err = fleet
        .admin
        .send::<_, Changed>(Method::PUT, &location_path(&sfo_id), &SetDeviceLocation { location: Some(forged) })
        .await
        .unwrap_err();
    assert_eq!(client_code(&err).as_deref(), Some("bad_request"), "{err}");
    let unknown = "ab".repeat(20);
    let err = fleet
        .admin
        .send::<_, Changed>(Method::PUT, &location_path(&unknown), &SetDeviceLocation { location: None })
        .await
        .unwrap_err();
    assert_eq!(client_code(&err).as_deref(), Some("not_found"), "{err}");
    let req = CreateApiToken { name: "coi-viewer".into(), role: "viewer".into(), expires_in_s: None };
    let viewer: TokenCreated = fleet.admin.send(Method::POST, paths::API_TOKENS, &req).await.unwrap();
    let (ok, _, err) = fleet.cli_as(&viewer.token, &["device", "set-location", &sfo_id, "1,1"]).await;
    assert!(!ok && err.contains("operator role"), "{err}");
}
