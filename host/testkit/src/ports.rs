//! Ports for servers a test stops and starts again on the same address (a control plane that
//! devices enrolled with): taken below the kernel's ephemeral range, so no outgoing connection
//! of this machine is handed the port while the server is down. A port the kernel picked
//! (`:0`) comes from that range, and a fleet test's restarted control plane once found its
//! port taken ("Address already in use").

use std::net::{SocketAddr, TcpListener};

use rand::Rng;

/// The lowest port of the kernel's ephemeral range (`ip_local_port_range`; Linux's default
/// 32768 where it cannot be read).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A loopback address whose TCP port is free now and outside the ephemeral range (ports from
/// 10,000 up to it, tried at random).
pub fn stable_loopback() -> anyhow::Result<SocketAddr> {
    let low = ephemeral_low().max(10_001);
    let mut rng = rand::rng();
    for _ in 0..200 {
        let addr = SocketAddr::from(([127, 0, 0, 1], rng.random_range(10_000..low)));
        if TcpListener::bind(addr).is_ok() {
            return Ok(addr);
        }
    }
    anyhow::bail!("no free port between 10000 and {low} after 200 tries")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_ports_are_free_and_below_the_ephemeral_range() {
        let addr = stable_loopback().unwrap();
        assert!(addr.port() >= 10_000 && addr.port() < ephemeral_low(), "{addr}");
        TcpListener::bind(addr).expect("free");
    }
}
