//! The HTTP side's one error type: every refusal, each with its status and a message that says
//! what to do, mapped to a response here and nowhere else. Bodies are `{"error": "..."}`, as
//! InfluxDB 1.x answers, which its clients and Telegraf show; the v2 write endpoint wraps the
//! same errors in InfluxDB 2.x's `{"code", "message"}` ([`V2`]).

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use timeshard_proto::wire::{ErrorCode, ErrorReply};

/// A request the HTTP side refuses, or a failure behind it.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    BadRequest(String),
    /// Some lines or series were stored, others refused (InfluxDB's partial write).
    #[error("{0}")]
    PartialWrite(String),
    #[error(
        "the request body is larger than this node's limit of {limit} bytes ([http] max_body_bytes); send smaller batches"
    )]
    TooLarge { limit: usize },
    #[error(
        "the body of this query is larger than this node's limit of {limit} bytes ([http] max_query_body_bytes); \
         a statement that long is not one a dashboard writes: shorten it, or raise the limit"
    )]
    QueryTooLarge { limit: usize },
    #[error(
        "the body decompresses to {declared} bytes, which decoded may take {expanded} bytes, more than the {share} \
         bytes the memory budget gives requests ([memory] budget); send smaller batches"
    )]
    DecodesTooLarge { declared: usize, expanded: u64, share: u64 },
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    NotFound(String),
    /// `Host` names no name of this node (DNS rebinding).
    #[error("{0}")]
    MisdirectedHost(String),
    /// Sent by a web page whose origin is not allowed.
    #[error("{0}")]
    CrossSite(String),
    #[error(
        "the request body did not arrive within {0:?} ([http] body_timeout); send it at once, or raise the timeout"
    )]
    BodyTimeout(std::time::Duration),
    #[error("the node is serving its maximum of {0} HTTP requests; retry shortly")]
    Overloaded(usize),
    #[error("the request took longer than {0:?}; narrow it, or retry")]
    Timeout(std::time::Duration),
    /// An error from the coordinator, with its code.
    #[error("{}", .0.message)]
    Node(ErrorReply),
    #[error("{0}")]
    Internal(String),
}

impl From<ErrorReply> for ApiError {
    fn from(e: ErrorReply) -> ApiError {
        ApiError::Node(e)
    }
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::BadRequest(_) | ApiError::PartialWrite(_) => StatusCode::BAD_REQUEST,
            ApiError::TooLarge { .. } | ApiError::QueryTooLarge { .. } | ApiError::DecodesTooLarge { .. } => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MisdirectedHost(_) => StatusCode::MISDIRECTED_REQUEST,
            ApiError::CrossSite(_) => StatusCode::FORBIDDEN,
            ApiError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::Overloaded(_) | ApiError::Timeout(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Node(e) => match e.code {
                ErrorCode::Malformed
                | ErrorCode::BatchTooLarge
                | ErrorCode::InvalidRange
                | ErrorCode::TimestampOutOfRange
                | ErrorCode::InvalidSeries
                | ErrorCode::Rejected
                | ErrorCode::Policy => StatusCode::BAD_REQUEST,
                ErrorCode::UnknownSeries => StatusCode::NOT_FOUND,
                ErrorCode::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::Forbidden => StatusCode::FORBIDDEN,
                ErrorCode::Unavailable | ErrorCode::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::Storage | ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            },
        }
    }

    /// InfluxDB 2.x's error code for the status.
    fn v2_code(&self) -> &'static str {
        match self.status() {
            StatusCode::UNAUTHORIZED => "unauthorized",
            StatusCode::FORBIDDEN => "forbidden",
            StatusCode::PAYLOAD_TOO_LARGE => "request too large",
            StatusCode::NOT_FOUND => "not found",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable",
            StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported media type",
            s if s.is_server_error() => "internal error",
            _ => "invalid",
        }
    }

    fn respond(self, body: serde_json::Value) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(%status, error = %self, "HTTP request failed");
        }
        let mut response = (status, Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if status == StatusCode::REQUEST_TIMEOUT || status == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of a late or refused body may still arrive unread: the connection cannot
            // carry a next request.
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error": self.to_string()});
        self.respond(body)
    }
}

/// An error in InfluxDB 2.x's shape.
#[derive(Debug)]
pub struct V2(pub ApiError);

impl IntoResponse for V2 {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"code": self.0.v2_code(), "message": self.0.to_string()});
        self.0.respond(body)
    }
}

impl From<ApiError> for V2 {
    fn from(e: ApiError) -> V2 {
        V2(e)
    }
}
