//! Sans-IO core of a timeshard node.
//!
//! Owns ids and the XOR metric ([`id`]), timestamps, ranges and quanta ([`time`]), series keys
//! ([`series`]), points ([`point`]), time-factored keys ([`key`]), series classes ([`class`]),
//! the k-bucket routing table ([`routing`]), iterative lookups ([`lookup`]), write placement and
//! quorum tracking ([`placement`]), the wire messages with their framing ([`wire`]), and window
//! aggregates and their merging ([`window`]).
//!
//! It does no I/O and reads no clock: callers pass `now` and move the bytes. That keeps every
//! decision testable without sockets (the model is quinn-proto).

pub mod class;
pub mod id;
pub mod key;
pub mod lookup;
pub mod placement;
pub mod point;
pub mod routing;
pub mod series;
pub mod time;
pub mod window;
pub mod wire;

pub use class::{Classes, Replication, SeriesClass};
pub use id::{Distance, Id};
pub use key::KeyFormat;
pub use lookup::Lookup;
pub use point::{Point, PointKey};
pub use routing::{Contact, RoutingTable};
pub use series::SeriesKey;
pub use time::{Quantum, QuantumLen, TimeRange, Timestamp};

/// Kademlia's bucket size and the number of contacts a lookup returns.
pub const K: usize = 20;
/// Requests a lookup keeps in flight.
pub const ALPHA: usize = 3;
