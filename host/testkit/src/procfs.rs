//! What Linux's `/proc` says about a process the benchmarks watch: its memory (resident now,
//! at its peak, virtual) and its CPU time, and starting its peak over. Linux only; elsewhere
//! every read is an error.

use std::time::Duration;

use anyhow::{Context, Result};

/// A process's memory, in bytes.
#[derive(Clone, Copy, Debug)]
pub struct Memory {
    /// Resident now (`VmRSS`).
    pub rss: u64,
    /// Resident at its peak since start or [`reset_peak`] (`VmHWM`).
    pub peak: u64,
    /// Virtual size (`VmSize`).
    pub virt: u64,
}

/// Process `pid`'s memory.
pub fn memory(pid: u32) -> Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status (is the process running?)"))?;
    let bytes = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kib| kib * 1024)
            .with_context(|| format!("no {key} in /proc/{pid}/status"))
    };
    Ok(Memory { rss: bytes("VmRSS:")?, peak: bytes("VmHWM:")?, virt: bytes("VmSize:")? })
}

/// Starts process `pid`'s peak resident memory over from its current (`clear_refs` 5).
pub fn reset_peak(pid: u32) -> Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        .with_context(|| format!("resetting the peak of /proc/{pid} (a process of another user?)"))
}

/// User + system CPU time of process `pid` so far.
pub fn cpu_time(pid: u32) -> Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat (is the process running?)"))?;
    // Fields after the command name (which may hold spaces): state is the 3rd field, utime
    // and stime the 14th and 15th.
    let rest = stat.rsplit_once(')').with_context(|| format!("malformed /proc/{pid}/stat"))?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields
        .get(11..13)
        .with_context(|| format!("short /proc/{pid}/stat"))?
        .iter()
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    // Linux reports these in USER_HZ, 100 per second on every architecture it exposes to user
    // space that way.
    Ok(Duration::from_millis(ticks * 10))
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_memory_and_cpu_time() {
        // Work enough for a tick of CPU time, and touch memory so it is resident.
        let mut v = vec![0u8; 8 << 20];
        let started = std::time::Instant::now();
        while cpu_time(std::process::id()).unwrap() < Duration::from_millis(20) {
            v.iter_mut().for_each(|b| *b = b.wrapping_add(1));
            assert!(started.elapsed() < Duration::from_secs(30));
        }
        let m = memory(std::process::id()).unwrap();
        assert!(m.rss >= 8 << 20 && m.peak >= m.rss && m.virt >= m.rss, "{m:?}");
        assert!(memory(u32::MAX).is_err());
    }
}
