//! The service's one error type: every refusal the API can give, each with an HTTP status, a
//! stable code (the client's [`timeshard_control_api::api::ErrorBody::code`]) and a message that
//! says what to do. Mapped to responses here and nowhere else.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use timeshard_control_api::api::{ErrorBody, UnknownRole};
use timeshard_control_api::class::ClassError;
use timeshard_control_api::token::TokenError;

use crate::time::show_ms;

/// A request the service refuses, or a failure of the service itself.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No or no valid API token.
    #[error("{0}; pass an API token with --token or TIMESHARD_CONTROL_TOKEN")]
    Unauthorized(String),
    /// The API token's role is too low.
    #[error(
        "this needs the {needed} role; your token ({token}) has {has}: ask an admin for a token with `api-token create --role {needed}`"
    )]
    Forbidden { needed: &'static str, has: String, token: String },
    #[error("{0}")]
    TokenMalformed(#[from] TokenError),
    #[error(
        "this token belongs to the fleet whose CA fingerprint is {token_fleet}, but this control plane's is {ours}; \
         use a token created by this control plane"
    )]
    TokenWrongFleet { token_fleet: String, ours: String },
    /// Unknown id or wrong secret: forged, mistyped, or from another database.
    #[error("{kind} not recognized: it was never issued here (forged, mistyped, or deleted)")]
    TokenUnknown { kind: &'static str },
    #[error(
        "this enrollment token was already used at {} by node {by}; tokens are single-use: \
         create a new one with `timeshard-control token create`", show_ms(*.at_ms)
    )]
    TokenUsed { at_ms: i64, by: String },
    #[error("this {kind} expired at {}; create a new one", show_ms(*.at_ms))]
    TokenExpired { kind: &'static str, at_ms: i64 },
    #[error("this API token was revoked at {}", show_ms(*.at_ms))]
    TokenRevoked { at_ms: i64 },
    #[error("malformed certificate signing request: {0}; send a PEM PKCS#10 request signed by the node's key")]
    CsrInvalid(String),
    #[error(
        "the key in this request is already enrolled as node {node_id}; an enrolled node renews its \
         certificate with `renew`, a new device needs a key of its own"
    )]
    KeyEnrolled { node_id: String },
    #[error("renewal must keep the node's key (node {node_id}); the request is for another key")]
    CsrKeyMismatch { node_id: String },
    #[error("this endpoint needs the node's certificate (mutual TLS); enroll the device first")]
    NodeCertificateRequired,
    #[error("node {node_id} is not enrolled here (its certificate is from this fleet, but no device has its key)")]
    UnknownDevice { node_id: String },
    #[error("node {node_id} was revoked at {}; enroll the device again with a new token and key", show_ms(*.at_ms))]
    Revoked { node_id: String, at_ms: i64 },
    #[error("{0}")]
    Class(#[from] ClassError),
    #[error("invalid node configuration {name:?}: {reason}")]
    NodeConfigInvalid { name: String, reason: String },
    #[error(
        "selector {selector} matches no enrolled device; check labels with `timeshard-control devices`, \
         or pass --allow-empty to configure devices that will enroll later"
    )]
    SelectorMatchesNothing { selector: String },
    #[error("{what} not found")]
    NotFound { what: String },
    /// Uploaded bytes that are not a policy this fleet's nodes can run.
    #[error("{name}@{version} is not accepted: {reason}")]
    PolicyInvalid { name: String, version: String, reason: String },
    #[error(
        "the module is {size} bytes, above the limit of {limit} bytes; build it in release mode and strip it \
         (see guest/README.md)"
    )]
    ModuleTooLarge { size: usize, limit: usize },
    #[error(
        "{name}@{version} was already uploaded with other bytes (sha256 {existing}, these are {uploaded}); a name and \
         version always mean the same module: upload it as a new version"
    )]
    VersionConflict { name: String, version: String, existing: String, uploaded: String },
    #[error("{name} is an {existing} policy; a {uploaded} policy needs a name of its own")]
    KindConflict { name: String, existing: String, uploaded: String },
    #[error(
        "{name} has no version {version} (uploaded: {known}); upload it first with `timeshard-control policy upload`"
    )]
    UnknownVersion { name: String, version: String, known: String },
    #[error(
        "a rollout of {policy} (to {version}, {state} at stage {stage}) is in progress; promote it to the end, or \
         roll it back, before starting another"
    )]
    RolloutInProgress { policy: String, version: String, state: String, stage: String },
    #[error("the latest rollout of {policy} is {state}; {what}")]
    RolloutState { policy: String, state: String, what: String },
    #[error(
        "selector {selector} matches no enrolled device, so the rollout would reach nobody; check labels with \
         `timeshard-control devices`"
    )]
    RolloutTargetsNothing { selector: String },
    #[error("{0}")]
    UnknownRole(#[from] UnknownRole),
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("request body too large: {0}")]
    TooLarge(String),
    #[error("the control plane is overloaded ({0}); retry shortly")]
    Overloaded(&'static str),
    #[error("the request took longer than {0:?}; retry")]
    Timeout(std::time::Duration),
    #[error("the request body did not arrive within {0:?}; send it at once")]
    BodyTimeout(std::time::Duration),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("{0}")]
    Internal(String),
}

impl Error {
    /// Status and stable code.
    pub fn status_code(&self) -> (StatusCode, &'static str) {
        use Error::*;
        match self {
            Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Forbidden { .. } => (StatusCode::FORBIDDEN, "forbidden"),
            TokenMalformed(_) => (StatusCode::BAD_REQUEST, "token_malformed"),
            TokenWrongFleet { .. } => (StatusCode::FORBIDDEN, "token_wrong_fleet"),
            TokenUnknown { .. } => (StatusCode::UNAUTHORIZED, "token_unknown"),
            TokenUsed { .. } => (StatusCode::CONFLICT, "token_used"),
            TokenExpired { .. } => (StatusCode::UNAUTHORIZED, "token_expired"),
            TokenRevoked { .. } => (StatusCode::UNAUTHORIZED, "token_revoked"),
            CsrInvalid(_) => (StatusCode::BAD_REQUEST, "csr_invalid"),
            KeyEnrolled { .. } => (StatusCode::CONFLICT, "key_enrolled"),
            CsrKeyMismatch { .. } => (StatusCode::BAD_REQUEST, "csr_key_mismatch"),
            NodeCertificateRequired => (StatusCode::UNAUTHORIZED, "node_certificate_required"),
            UnknownDevice { .. } => (StatusCode::FORBIDDEN, "unknown_device"),
            Revoked { .. } => (StatusCode::FORBIDDEN, "revoked"),
            Class(ClassError::DuplicatePrefix { .. } | ClassError::Immutable { .. }) => {
                (StatusCode::CONFLICT, "class_conflict")
            }
            Class(_) => (StatusCode::BAD_REQUEST, "class_invalid"),
            NodeConfigInvalid { .. } => (StatusCode::BAD_REQUEST, "node_config_invalid"),
            SelectorMatchesNothing { .. } => (StatusCode::BAD_REQUEST, "selector_matches_nothing"),
            NotFound { .. } => (StatusCode::NOT_FOUND, "not_found"),
            PolicyInvalid { .. } => (StatusCode::BAD_REQUEST, "policy_invalid"),
            ModuleTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "module_too_large"),
            VersionConflict { .. } => (StatusCode::CONFLICT, "version_conflict"),
            KindConflict { .. } => (StatusCode::CONFLICT, "kind_conflict"),
            UnknownVersion { .. } => (StatusCode::NOT_FOUND, "unknown_version"),
            RolloutInProgress { .. } => (StatusCode::CONFLICT, "rollout_in_progress"),
            RolloutState { .. } => (StatusCode::CONFLICT, "rollout_state"),
            RolloutTargetsNothing { .. } => (StatusCode::BAD_REQUEST, "rollout_targets_nothing"),
            UnknownRole(_) => (StatusCode::BAD_REQUEST, "unknown_role"),
            BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
            Overloaded(_) => (StatusCode::SERVICE_UNAVAILABLE, "overloaded"),
            Timeout(_) => (StatusCode::SERVICE_UNAVAILABLE, "timeout"),
            BodyTimeout(_) => (StatusCode::REQUEST_TIMEOUT, "body_timeout"),
            Database(_) => (StatusCode::INTERNAL_SERVER_ERROR, "database"),
            Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let (status, code) = self.status_code();
        if status.is_server_error() {
            tracing::warn!(code, error = %self, "request failed");
        }
        (status, Json(ErrorBody { code: code.to_string(), error: self.to_string() })).into_response()
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
