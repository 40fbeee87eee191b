//! What devices share with the control plane: API types, tokens, desired state, the node's
//! agent. Nothing here needs a database or a server: the HTTP API's JSON types ([`api`]),
//! desired state and how it is computed from classes and node configurations ([`state`],
//! [`class`]), which devices a configuration, token or rollout selects ([`selector`], a leaf)
//! and where a device is ([`geo`], with `timeshard_proto`'s geohash), enrollment and API tokens
//! ([`token`]), TLS to the control plane with CA pinning ([`tls`]), a small HTTPS client
//! ([`http`]), and the device-side agent a node uses to enroll, renew its certificate, watch
//! its desired state and report what it runs ([`agent`], [`files`]). Policy modules and their
//! staged rollouts: the API's types ([`policy`]) and which node runs which version ([`rollout`]).
//!
//! The service itself (database, CA, HTTP server, CLI) is the `timeshard-control` crate.

pub mod agent;
pub mod api;
pub mod class;
pub mod files;
pub mod geo;
pub mod http;
pub mod policy;
pub mod rollout;
pub mod selector;
pub mod state;
pub mod tls;
pub mod token;

pub use agent::{Agent, AgentError, Credentials, Enrolled, NodeClient, enroll, request_enrollment};
pub use api::Role;
pub use class::ClassSpec;
pub use geo::Location;
pub use selector::Selector;
pub use state::{DesiredState, FleetState, HttpTokenEntry, HttpTokenGrant, NodeConfigEntry, NodeSettings};
pub use token::{Fingerprint, Token, TokenKind};
