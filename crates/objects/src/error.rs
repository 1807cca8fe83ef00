//! The crate's typed errors: IDs, the node-level store (fence and blobs),
//! and an object's storage as its callers (the WIT `storage-error`) see it.

/// Why a string is not an object ID of a namespace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// Not 64 hexadecimal digits.
    #[error("malformed object ID: {0}")]
    Malformed(String),
    /// A well-formed ID made by another namespace (another script or
    /// class): its check part does not match this namespace.
    #[error("object ID belongs to another namespace")]
    OtherNamespace,
}

/// Errors of the node-level store: opening an object, the fence, blobs.
#[derive(Debug, thiserror::Error)]
pub enum ObjectsError {
    /// The fence holds a newer claim on the object than the caller's: the
    /// caller is no longer its owner and must not write.
    #[error("superseded: another owner claimed the object")]
    Superseded,
    /// The fence store (SQLite file, etcd) failed or could not be reached.
    #[error("fence store: {0}")]
    Fence(String),
    /// The blob store failed or could not be reached.
    #[error("blob store: {0}")]
    Blob(String),
    /// A head names a blob the blob store does not have.
    #[error("blob {0} named by the object's head is missing")]
    MissingBlob(String),
    /// Stored state that does not decode or does not match its hash.
    #[error("corrupt object state: {0}")]
    Corrupt(String),
    /// An argument the store refuses (for example a blob name that is not
    /// a blake3 hash).
    #[error("invalid: {0}")]
    Invalid(String),
    /// The working copy (in-memory SQLite) failed.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
}

/// Errors of an object's storage operations; the variants mirror the WIT
/// `storage-error` (`not-an-object` is the host's, not this crate's).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
    /// A limit was exceeded; the message names the limit and its value.
    #[error("limit exceeded: {0}")]
    Limit(String),
    /// A malformed request (for example `start` with `start_after`, or a
    /// commit with no transaction open).
    #[error("invalid: {0}")]
    Invalid(String),
    /// Another owner claimed the object: nothing written since the last
    /// successful flush is durable, and the instance must be discarded.
    #[error("superseded: another owner claimed the object")]
    Superseded,
    /// The storage could not make writes durable (fence or blob store
    /// unreachable); the writes remain pending and a later flush retries.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

impl From<ObjectsError> for StorageError {
    fn from(error: ObjectsError) -> Self {
        match error {
            ObjectsError::Superseded => StorageError::Superseded,
            ObjectsError::Invalid(message) => StorageError::Invalid(message),
            other => StorageError::Unavailable(other.to_string()),
        }
    }
}

impl From<rusqlite::Error> for StorageError {
    fn from(error: rusqlite::Error) -> Self {
        StorageError::Unavailable(format!("working copy: {error}"))
    }
}
