//! The crate's one error type: every operation fails in the same few ways.

use timeshard_store::StoreError;

use crate::layout::NameError;

/// Failures of the archive. Each says what failed, on which object, and what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The archive URL cannot be used.
    #[error("archive URL {url:?} cannot be used: {reason}")]
    BadUrl { url: String, reason: String },
    /// The object store refused or failed an operation (after the retries the operation has).
    #[error(
        "object store failed to {op} {path}: {source}; check that the archive is reachable and writable \
         (hot data is kept until the archive confirms it)"
    )]
    Store {
        op: &'static str,
        path: String,
        #[source]
        source: object_store::Error,
    },
    /// An archive object does not decode as what its name says it is. Other objects are still
    /// served; a query that needs this one fails until it is repaired or removed.
    #[error("archive file {path} is corrupt or truncated: {detail}; restore it from a copy, or re-export its blocks")]
    Corrupt { path: String, detail: String },
    /// A manifest whose seal does not check (unsealed, sealed by another node than the one
    /// whose folder it sits in, by a certificate not of the fleet, or changed after sealing).
    /// Its blocks are not read; everything else stays readable.
    #[error(
        "archive manifest {path} is refused: {reason}; its blocks are not read. Remove it, or restore the node's \
         own copy (only the node whose folder it is in may write there)"
    )]
    Refused { path: String, reason: String },
    /// A points file just uploaded does not read back as what was written (checked before its
    /// manifest commits it); the export retries it.
    #[error("archive file {path} does not hold what was uploaded: {detail}")]
    Mismatch { path: String, detail: String },
    /// A class or node name that cannot name archive objects.
    #[error(transparent)]
    Name(#[from] NameError),
    /// A request that cannot be served as asked.
    #[error("invalid request: {0}")]
    InvalidInput(String),
    /// The hot store failed while the exporter read blocks from it.
    #[error("reading hot blocks to export: {0}")]
    Hot(#[from] StoreError),
    /// A background task of the crate ended unexpectedly (a bug).
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    pub(crate) fn store(op: &'static str, path: impl ToString) -> impl FnOnce(object_store::Error) -> Error {
        let path = path.to_string();
        move |source| Error::Store { op, path, source }
    }

    pub(crate) fn corrupt(path: impl ToString, detail: impl ToString) -> Error {
        Error::Corrupt { path: path.to_string(), detail: detail.to_string() }
    }

    /// Whether retrying the same operation later may succeed (the store failed, not the data).
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Store { source, .. } => !matches!(source, object_store::Error::NotFound { .. }),
            Error::Mismatch { .. } => true,
            _ => false,
        }
    }
}
