//! The `timeshard` command line against a small cluster: put (arguments and CSV on stdin),
//! get (CSV and JSON), status, and the node's printed configuration.

use std::io::Write;
use std::process::{Command, Stdio};

use timeshard_testkit::cluster::{ClusterOptions, LocalCluster};

use crate::NODE;

fn run(args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    let mut child = Command::new(NODE)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    if let Some(input) = stdin {
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_and_status_round_trip() -> anyhow::Result<()> {
    let (options, _dir) = ClusterOptions::for_tests(3, NODE);
    let cluster = LocalCluster::start_converged(options).await?;
    let node = cluster.addr(1).to_string();
    let pki = cluster.pki_dir().display().to_string();
    let conn = ["--node", node.as_str(), "--pki", pki.as_str()];
    let series = "cli.test{room=lab}";

    let (ok, _, err) =
        run(&[&["put"], &conn[..], &[series, "1700000000000000000=1.5", "1700000000000000000=2.5#7"]].concat(), None);
    assert!(ok, "{err}");
    assert!(err.contains("wrote 2 points"), "{err}");
    let csv = "ts,value,event\n2023-11-14T22:13:21Z,3.25,\n1700000002000000000,-4,0\n";
    let (ok, _, err) = run(&[&["put"], &conn[..], &[series]].concat(), Some(csv));
    assert!(ok, "{err}");
    let mixed = "series,ts,value\n\"cli.other{a=1,b=2}\",1700000000000000000,9\n";
    let (ok, _, err) = run(&[&["put"], &conn[..]].concat(), Some(mixed));
    assert!(ok, "{err}");

    let range = ["--start", "2023-11-14T22:13:20Z", "--end", "1700000003000000000"];
    let (ok, out, err) = run(&[&["get"], &conn[..], &[series], &range[..]].concat(), None);
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "ts,value,event\n1700000000000000000,1.5,0\n1700000000000000000,2.5,7\n1700000001000000000,3.25,0\n\
         1700000002000000000,-4,0\n"
    );
    let (ok, out, err) = run(
        &[&["get"], &conn[..], &["cli.other{b=2,a=1}"], &range[..], &["--format", "json", "--time", "rfc3339"]]
            .concat(),
        None,
    );
    assert!(ok, "{err}");
    assert!(out.contains("\"series\": \"cli.other{a=1,b=2}\"") && out.contains("2023-11-14T22:13:20"), "{out}");

    // Windows: the four points of `series` fall into the 10 s window at 1700000000.
    let (ok, out, err) = run(&[&["get"], &conn[..], &[series], &range[..], &["--window", "10s"]].concat(), None);
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "start,end,count,min,max,mean,sum,first,last\n1700000000000000000,1700000003000000000,4,-4,3.25,0.8125,3.25,1.5,-4\n"
    );
    let (ok, out, err) = run(&[&["series"], &conn[..], &["--metric", "cli."]].concat(), None);
    assert!(ok, "{err}");
    assert_eq!(out, "cli.other{a=1,b=2}\ncli.test{room=lab}\n");
    let (ok, out, _) = run(&[&["series"], &conn[..], &["--tag", "room=lab"]].concat(), None);
    assert!(ok && out == "cli.test{room=lab}\n", "{out}");

    // Bad input is reported, not hidden.
    let (ok, _, err) = run(&[&["get"], &conn[..], &[series, "--start", "5", "--end", "1"]].concat(), None);
    assert!(!ok && err.contains("inverted"), "{err}");
    let (ok, _, err) = run(&[&["put"], &conn[..], &[series]].concat(), Some("1,notanumber\n"));
    assert!(!ok && err.contains("line 1"), "{err}");

    let (ok, out, err) = run(&[&["status"], &conn[..]].concat(), None);
    assert!(ok, "{err}");
    assert!(out.contains(&cluster.id(1).to_string()) && out.contains("knows 2 peers"), "{out}");

    assert_eq!(cluster.shutdown().await?, 3);
    Ok(())
}

#[test]
fn node_prints_its_configuration_and_refuses_bad_files() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("node.toml");
    std::fs::write(&cfg, "listen = \"127.0.0.1:7999\"\n[[class]]\nname = \"pmu\"\nmetric_prefix = \"pmu.\"\nformat = \"kfi\"\nquantum = \"30s\"\n").unwrap();
    let (ok, out, err) = run(&["node", "--config", cfg.to_str().unwrap(), "--print-config"], None);
    assert!(ok, "{err}");
    assert!(
        out.contains("listen = \"127.0.0.1:7999\"")
            && out.contains("quantum = \"30s\"")
            && out.contains("format = \"kfi\""),
        "{out}"
    );
    std::fs::write(&cfg, "[dht]\nk = 0\n").unwrap();
    let (ok, _, err) = run(&["node", "--config", cfg.to_str().unwrap()], None);
    assert!(!ok && err.contains("dht.k"), "{err}");
    let (ok, out, _) = run(&["--help"], None);
    assert!(ok && out.contains("timeshard demo"), "{out}");
}

#[test]
fn the_example_deployment_config_is_valid() {
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/node.toml");
    let (ok, out, err) = run(&["node", "--config", config.to_str().unwrap(), "--print-config"], None);
    assert!(ok, "{err}");
    let printed: timeshard_node::NodeConfig = toml::from_str(&out).expect("the printed config reads back");
    let pmu = printed.classes.iter().find(|c| c.name == "pmu").expect("the pmu class");
    assert_eq!(pmu.retention, Some(std::time::Duration::from_secs(90 * 86_400)));
    assert_eq!(printed.classes.len(), 2);
}
