//! The one error type of the policy host: every way loading or running a policy can fail, and
//! the serializable [`FailureKind`] that a node reports (metrics, pass-through outcomes,
//! replies to writers).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::Kind;

/// Loading or running a policy failed.
///
/// `policy` fields name the policy as `name@version`. Load errors (signature, format, imports,
/// world) leave whatever ran before running; call errors (trap, timeout, limits, output) fail
/// that call only, and the next call gets a fresh instance.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// No signature was supplied with the module.
    #[error(
        "policy {policy} is unsigned: sign the module with `timeshard policy sign --key KEY_FILE MODULE.wasm` \
         and install the .sig file next to it"
    )]
    Unsigned { policy: String },
    /// The signature file could not be read or parsed.
    #[error("policy {policy}: the signature is malformed ({reason}); sign the module again")]
    MalformedSignature { policy: String, reason: String },
    /// Signed by a key the node does not trust.
    #[error(
        "policy {policy} is signed by key {key}, which this node does not trust: sign it with a trusted policy \
         key, or add the key's public half to the node's trusted policy keys"
    )]
    Untrusted { policy: String, key: String },
    /// Signed by a trusted key, but the signature does not match the bytes: tampered, or the
    /// signature of another build.
    #[error(
        "policy {policy}: the signature by key {key} does not match the module's bytes (sha256 {sha256}); the \
         module was changed after signing, or the .sig belongs to another build: sign the exact file you install"
    )]
    BadSignature { policy: String, key: String, sha256: String },
    /// A valid signature made for another name, version or kind than the module is installed as.
    #[error(
        "policy {policy}: its signature was made for {signed}, and a signature binds a module to one name, \
         version and kind; sign the module as what it is installed as (`timeshard policy sign --name NAME \
         --version VERSION --kind KIND`)"
    )]
    WrongIdentity { policy: String, signed: String },
    /// A version that a trusted signature's minimum version revoked (see
    /// [`crate::signing`]): refused even with a valid signature.
    #[error(
        "policy {policy} is revoked: a signed module installed before revoked the versions of {name} below \
         {floor}; install {name} {floor} or later"
    )]
    Revoked { policy: String, name: String, floor: String },
    /// A signature of the old format (over the bytes only), which the node does not accept.
    #[error(
        "policy {policy} carries a signature of the old format (timeshard-policy-signature-v1, over the bytes \
         only), which does not bind its name, version and kind: sign it again with `timeshard policy sign \
         --key KEY --name NAME --version VERSION --kind KIND MODULE.wasm`, or accept old signatures during a \
         migration with `allow_v1_signatures = true` in [policy]"
    )]
    LegacySignature { policy: String },
    /// The bytes are not a WebAssembly component wasmtime can compile.
    #[error(
        "policy {policy} is not a valid WebAssembly component ({reason}); build it with \
         `cargo build --release --target wasm32-wasip2` (see guest/README.md)"
    )]
    Malformed { policy: String, reason: String },
    /// The component imports something the host does not grant.
    #[error(
        "policy {policy} imports `{import}`, which policies may not use: the host grants only {allowed}; build \
         the guest without std and WASI (see guest/support)"
    )]
    ForbiddenImport { policy: String, import: String, allowed: &'static str },
    /// The component does not implement the world it was installed as.
    #[error("policy {policy} is not an {expected} policy ({reason}); check its `kind` and its WIT world")]
    WrongWorld { policy: String, expected: Kind, reason: String },
    /// The guest trapped (panic, `unreachable`, out-of-bounds access, stack overflow...).
    #[error("policy {policy} trapped: {message}{}", last_log.as_ref().map(|l| format!(" (its last log line: {l})")).unwrap_or_default())]
    Trap { policy: String, message: String, last_log: Option<String> },
    /// The call ran past its deadline and was stopped.
    #[error(
        "policy {policy} ran past its deadline of {deadline_ms} ms and was stopped; fix the policy or raise its \
         `deadline_ms`"
    )]
    Timeout { policy: String, deadline_ms: u64 },
    /// The guest asked for more memory than its cap.
    #[error(
        "policy {policy} tried to use more than its memory cap of {limit_bytes} bytes and was stopped; give it \
         smaller batches or raise its `memory_mib`"
    )]
    MemoryLimit { policy: String, limit_bytes: u64 },
    /// The guest returned more than the host accepts.
    #[error("policy {policy} returned {got} {what}; at most {limit} are accepted")]
    OutputTooLarge { policy: String, what: &'static str, got: u64, limit: u64 },
    /// The guest returned something inconsistent (an index out of range, a bad timestamp...).
    #[error("policy {policy} returned an invalid result: {reason}")]
    BadOutput { policy: String, reason: String },
    /// The guest itself reported an error (e.g. a missing or malformed setting).
    #[error("policy {policy} failed: {message}")]
    Guest { policy: String, message: String },
    /// The input is larger than the host passes to a guest.
    #[error("{what}: {got} is more than the limit of {limit}; split the request")]
    InputTooLarge { what: &'static str, got: u64, limit: u64 },
    /// No instance could be created (e.g. every pooled slot is in use).
    #[error("cannot instantiate policy {policy}: {reason}; retry, or raise `max_instances`")]
    Instantiate { policy: String, reason: String },
    /// The named policy (or version) is not installed on this node.
    #[error("policy {policy} is not installed on this node; install it first (installed: {installed})")]
    NotInstalled { policy: String, installed: String },
    /// A query asked for one version of a policy and this node runs another: a query runs one
    /// version on every node it touches.
    #[error(
        "query policy {name}: the query runs {name}@{wanted}, but this node runs {here}; a query never merges \
         partial results of different versions: retry once the rollout of {name} is finished"
    )]
    OtherVersion { name: String, wanted: String, here: String },
    /// The query policy is not bound to the series.
    #[error(
        "query policy {policy} is not bound to series {series}: add it to the `query` list of a binding whose \
         selector matches the series"
    )]
    NotBound { policy: String, series: String },
    /// Partials handed to a merge do not fit together.
    #[error("cannot merge the partials of {policy}: {reason}")]
    BadPartials { policy: String, reason: String },
    /// The policy configuration (bindings, names, versions, settings) is invalid.
    #[error("invalid policy configuration: {0}")]
    Config(String),
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The WebAssembly engine could not be set up.
    #[error("cannot start the WebAssembly engine: {0}")]
    Engine(String),
}

/// What kind of failure a [`PolicyError`] is, for metrics and for the outcome of a batch that
/// was passed through unprocessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureKind {
    Signature,
    Malformed,
    ForbiddenImport,
    WrongWorld,
    Trap,
    Timeout,
    MemoryLimit,
    OutputTooLarge,
    BadOutput,
    Guest,
    InputTooLarge,
    Instantiate,
    NotInstalled,
    NotBound,
    BadPartials,
    Config,
    Io,
    Engine,
}

impl PolicyError {
    /// The kind of failure.
    pub fn kind(&self) -> FailureKind {
        use PolicyError::*;
        match self {
            Unsigned { .. }
            | MalformedSignature { .. }
            | Untrusted { .. }
            | BadSignature { .. }
            | WrongIdentity { .. }
            | Revoked { .. }
            | LegacySignature { .. } => FailureKind::Signature,
            Malformed { .. } => FailureKind::Malformed,
            ForbiddenImport { .. } => FailureKind::ForbiddenImport,
            WrongWorld { .. } => FailureKind::WrongWorld,
            Trap { .. } => FailureKind::Trap,
            Timeout { .. } => FailureKind::Timeout,
            MemoryLimit { .. } => FailureKind::MemoryLimit,
            OutputTooLarge { .. } => FailureKind::OutputTooLarge,
            BadOutput { .. } => FailureKind::BadOutput,
            Guest { .. } => FailureKind::Guest,
            InputTooLarge { .. } => FailureKind::InputTooLarge,
            Instantiate { .. } => FailureKind::Instantiate,
            NotInstalled { .. } | OtherVersion { .. } => FailureKind::NotInstalled,
            NotBound { .. } => FailureKind::NotBound,
            BadPartials { .. } => FailureKind::BadPartials,
            Config(_) => FailureKind::Config,
            Io { .. } => FailureKind::Io,
            Engine(_) => FailureKind::Engine,
        }
    }
}
