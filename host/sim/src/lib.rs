//! Deterministic simulation of a timeshard fleet: the real node code (`timeshard-node`, with
//! its coordinator, membership, placement, hints, repair, handoff and store) runs in one
//! process on one thread, in virtual time, on a simulated network and simulated disks, with
//! faults a seed picks; a checker reads the recorded history. A seed and a commit replay a run
//! bit for bit.
//!
//! The parts, from the ground up: [`net`] (datagrams between hosts: latency, loss,
//! duplication, reordering, partitions), [`host`] (a host: a paused runtime of its own, moved
//! through windows of virtual time), [`pki`] (certificates from the seed), [`control`] (the
//! control plane every node is enrolled in and follows), [`archive`] (the object store the
//! fleet exports to), [`fleet`] (nodes on hosts, with
//! faulty disks; start, crash, restart), [`workload`] (clients writing and
//! reading through the SDK), [`faults`] (the plan a seed draws), [`history`] (what a run
//! recorded), [`check`] (properties over a history), [`run`] (one seed, start to end) and [`watchdog`]
//! (a run whose simulated time stands still ends the process).
//! README.md's "Simulation" says why it is built this way and what it costs.

pub mod archive;
pub mod check;
pub mod control;
pub mod faults;
pub mod fleet;
pub mod history;
pub mod host;
pub mod net;
pub mod pki;
pub mod run;
pub mod watchdog;
pub mod workload;

pub use faults::Faults;
pub use run::{Options, Outcome, run};
