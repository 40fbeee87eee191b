//! Sans-IO core of a timeshard node.
//!
//! Owns ids and the XOR metric ([`id`]), stable hashes ([`hash`]), geohashes and distances
//! ([`geo`]), timestamps, ranges, quanta and block parts ([`time`]), series keys ([`series`]),
//! points and the batches that carry them ([`point`]) and how a batch is split into requests
//! within limits ([`batch`]), time-factored keys ([`key`]), series
//! classes ([`class`]), the k-bucket routing table ([`routing`]), iterative lookups
//! ([`lookup`]), the membership view and its gossip ([`membership`]), placement of blocks on
//! owners and quorum tracking ([`placement`]), replica agreement and merging on the read side
//! ([`agreement`]), the paging of range reads ([`read`]), streamed range reads per owner node
//! ([`stream`]) and packed block columns ([`packed`]), repair planning: digest trees,
//! settledness, handoff ([`repair`]), the quantum index of a series ([`quantum_index`]), window
//! aggregates ([`window`]), the cold tier's decisions ([`tier`]: when blocks are due, who exports
//! them), and the wire: messages, framing and validation ([`wire`]).
//!
//! Layers: `wire` sits on top and names the domain types of every other module; none of them
//! imports it back (repair counts frame bytes through the leaf [`wire::framing`]).
//!
//! It does no I/O and reads no clock: callers pass `now` and move the bytes. That keeps every
//! decision testable without sockets (the model is quinn-proto).

pub mod agreement;
pub mod batch;
pub mod beat_chain;
pub mod class;
pub mod geo;
pub mod hash;
pub mod id;
pub mod key;
pub mod lookup;
pub mod membership;
pub mod packed;
pub mod placement;
pub mod point;
pub mod quantum_index;
pub mod read;
pub mod repair;
pub mod routing;
pub mod series;
pub mod size;
pub mod stream;
pub mod tier;
pub mod time;
pub mod window;
pub mod wire;

pub use class::{AgeBy, Classes, Replication, SeriesClass};
pub use id::{Distance, Id};
pub use key::KeyFormat;
pub use lookup::Lookup;
pub use membership::Membership;
pub use point::{Point, PointKey};
pub use routing::{Contact, RoutingTable};
pub use series::SeriesKey;
pub use time::{Quantum, QuantumLen, TimeRange, Timestamp};

/// Kademlia's bucket size and the number of contacts a lookup returns.
pub const K: usize = 20;
/// Requests a lookup keeps in flight.
pub const ALPHA: usize = 3;
