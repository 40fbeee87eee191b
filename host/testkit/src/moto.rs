//! moto's S3 server (PyPI `moto[server]`) started on a loopback port, for the end-to-end tests
//! of the cold tier and for `timeshard bench tier`'s reads from S3.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use timeshard_clock::now_ns;

/// moto's S3 server (PyPI `moto[server]`) on a loopback port; killed when dropped.
#[derive(Debug)]
pub struct Moto {
    child: Option<Child>,
    pub port: u16,
}

impl Drop for Moto {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Moto {
    /// A free port for a server started later, below the range the system hands out for port
    /// 0 (32768 and up): nodes and their HTTP endpoints, started meanwhile, bind port 0 and
    /// cannot take it.
    pub fn reserve() -> Moto {
        let seed = std::process::id() as u16 ^ (now_ns() as u16);
        let port = (0..2_000u16)
            .map(|i| 20_000 + (seed.wrapping_add(i.wrapping_mul(7))) % 12_000)
            .find(|&p| TcpListener::bind(("127.0.0.1", p)).is_ok())
            .expect("a free port between 20000 and 32000");
        Moto { child: None, port }
    }

    /// Starts the server and creates `bucket`.
    pub fn start(&mut self, bucket: &str) -> Result<()> {
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &self.port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start moto_server: install it with `pip install 'moto[server]'` (scripts/test does)")?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            ensure!(Instant::now() < deadline, "moto_server did not listen on port {} within 30 s", self.port);
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        write!(
            s,
            "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )?;
        let mut reply = String::new();
        s.read_to_string(&mut reply)?;
        ensure!(reply.starts_with("HTTP/1.1 200"), "creating bucket {bucket}: {reply}");
        Ok(())
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The object store options that reach this server.
    pub fn options(&self) -> Vec<(String, String)> {
        [
            ("aws_endpoint", format!("http://127.0.0.1:{}", self.port)),
            ("aws_access_key_id", "testing".into()),
            ("aws_secret_access_key", "testing".into()),
            ("aws_region", "us-east-1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}
