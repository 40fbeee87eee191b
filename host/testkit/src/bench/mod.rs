//! The benchmarks of BENCHMARKS.md. Each `run` returns its JSON document, with the [`floor`]
//! measured in the same run, and prints a short human summary; they measure and never pass or
//! fail.

pub mod coi;
pub mod coi_sim;
pub mod fleet;
pub mod floor;
pub mod footprint;
pub mod hostile;
pub mod http;
pub mod http_reads;
pub mod paper;
pub mod policy;
pub mod policy_host;
pub mod promql;
pub mod repair;
pub mod repair_sim;
pub mod store;
pub mod tier;
mod tier_outage;
pub mod trust;

/// Where a benchmark works: the directory its options name, or a new temporary one (named
/// after the benchmark and this process) that is removed when this is dropped.
pub(crate) struct WorkDir {
    path: std::path::PathBuf,
    temporary: bool,
}

impl WorkDir {
    pub(crate) fn new(bench: &str, given: Option<&std::path::Path>) -> WorkDir {
        match given {
            Some(d) => WorkDir { path: d.to_path_buf(), temporary: false },
            None => WorkDir {
                path: std::env::temp_dir().join(format!("timeshard-bench-{bench}-{}", std::process::id())),
                temporary: true,
            },
        }
    }

    pub(crate) fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}
