//! # hearth-sdk-objects
//!
//! Durable Objects for Rust Workers: hearth's `hearth:objects` interfaces
//! (IDs and the object's storage) and stubs that call objects. Used beside
//! `hearth-sdk`.
//!
//! A Worker deployed with a Durable Object binding (`[durable_objects]`
//! `COUNTER = "Counter"` in its manifest, or `hearth deploy
//! --durable-object COUNTER=Counter`) makes IDs in that namespace and calls
//! the objects; hearth serves each object with one instance of the class's
//! script of its own, one request at a time. A Rust Worker has no classes:
//! the script serves both its plain requests and its objects', and tells
//! them apart with [`this_object`] (`Some` while it runs as an object).
//!
//! ```no_run
//! use hearth_sdk::fetch::{Request, Response};
//! use hearth_sdk::{Env, Worker};
//! use hearth_sdk_objects::{self as objects, storage};
//!
//! struct Counter;
//!
//! impl Worker for Counter {
//!     async fn fetch(req: Request, _env: Env) -> Response {
//!         if objects::this_object().is_some() {
//!             // The object: its count lives in its storage.
//!             let n = storage::get("n").ok().flatten().map_or(0, |v| {
//!                 u64::from_le_bytes(v.try_into().unwrap_or_default())
//!             }) + 1;
//!             return match storage::put("n", &n.to_le_bytes()) {
//!                 Ok(()) => Response::new(200, n.to_string()),
//!                 Err(e) => Response::new(500, e.to_string()),
//!             };
//!         }
//!         // The front Worker: the object called "global".
//!         let counter = objects::namespace("COUNTER");
//!         match counter.id_from_name("global") {
//!             Ok(id) => counter.get(&id).fetch(Request::get(req.path()))
//!                 .unwrap_or_else(|e| Response::new(502, e.to_string())),
//!             Err(e) => Response::new(500, e.to_string()),
//!         }
//!     }
//! }
//!
//! hearth_sdk::export_fetch!(Counter);
//! ```
//!
//! Writes are visible to the object at once; hearth makes them durable
//! before the object's response (or any request it makes) leaves
//! ([`storage::sync`] does so now). Values are bytes: encode them as you
//! like.

use hearth_sdk::fetch::{self, FetchError, Request, Response};

#[allow(missing_docs, unreachable_pub, clippy::all)]
mod bindings {
    wit_bindgen::generate!({
        path: "../../wit/hearth-objects",
        inline: "
            package hearth:sdk-objects;
            world objects {
                import hearth:objects/ids@0.1.0;
                import hearth:objects/storage@0.1.0;
            }
        ",
        world: "hearth:sdk-objects/objects",
        generate_all,
    });
}

use bindings::hearth::objects::{ids, storage as wit};

/// The request header that gives the URL an object's request has (the host
/// reads it on a request to `.object.internal`, and strips it from every
/// other request).
pub const OBJECT_URL_HEADER: &str = "hearth-object-url";

/// Why an ID could not be made or read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdError {
    /// The Worker has no Durable Object binding of that name.
    UnknownBinding(String),
    /// Not an ID of that binding's namespace.
    InvalidId(String),
}

impl std::fmt::Display for IdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IdError::UnknownBinding(m) => write!(f, "unknown Durable Object binding: {m}"),
            IdError::InvalidId(m) => write!(f, "invalid object ID: {m}"),
        }
    }
}

impl std::error::Error for IdError {}

impl From<ids::IdError> for IdError {
    fn from(e: ids::IdError) -> Self {
        match e {
            ids::IdError::UnknownBinding(m) => IdError::UnknownBinding(m),
            ids::IdError::InvalidId(m) => IdError::InvalidId(m),
        }
    }
}

/// An object's ID: 64 lowercase hex digits, valid in the namespace that
/// made it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectId(String);

impl ObjectId {
    /// The ID's 64 hex digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ObjectId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A Durable Object binding: the namespace of objects it addresses.
#[derive(Debug, Clone)]
pub struct Namespace {
    binding: String,
}

/// Durable Object binding `binding` (as deployed).
pub fn namespace(binding: &str) -> Namespace {
    Namespace {
        binding: binding.to_owned(),
    }
}

impl Namespace {
    /// The ID of the object called `name` (the same on every node, for
    /// ever).
    pub fn id_from_name(&self, name: &str) -> Result<ObjectId, IdError> {
        Ok(ObjectId(ids::id_from_name(&self.binding, name)?))
    }

    /// A new random ID.
    pub fn new_unique_id(&self) -> Result<ObjectId, IdError> {
        Ok(ObjectId(ids::new_unique_id(&self.binding)?))
    }

    /// `id` checked to be an ID of this namespace.
    pub fn id_from_string(&self, id: &str) -> Result<ObjectId, IdError> {
        Ok(ObjectId(ids::id_from_string(&self.binding, id)?))
    }

    /// A stub that calls the object `id`.
    pub fn get(&self, id: &ObjectId) -> Stub {
        Stub {
            host: format!("{}.{}.object.internal", self.binding, id.0),
        }
    }
}

/// Calls one object: its requests go to
/// `http://<binding>.<id>.object.internal/<path>`.
#[derive(Debug, Clone)]
pub struct Stub {
    host: String,
}

impl Stub {
    /// Sends `req` to the object. A `req.url` that is a path is the
    /// object's path; an absolute URL is the URL the object sees (carried
    /// in [`OBJECT_URL_HEADER`]).
    pub fn fetch(&self, req: Request) -> Result<Response, FetchError> {
        fetch::fetch(self.address(req))
    }

    /// [`Stub::fetch`] as a future.
    pub async fn fetch_async(&self, req: Request) -> Result<Response, FetchError> {
        fetch::fetch_async(self.address(req)).await
    }

    fn address(&self, mut req: Request) -> Request {
        if req.url.contains("://") {
            let path = req
                .url
                .split_once("://")
                .and_then(|(_, rest)| rest.find('/').map(|i| rest[i..].to_owned()))
                .unwrap_or_else(|| "/".to_owned());
            let url = std::mem::take(&mut req.url);
            req = req.header(OBJECT_URL_HEADER, url);
            req.url = format!("http://{}{path}", self.host);
        } else {
            let sep = if req.url.starts_with('/') { "" } else { "/" };
            req.url = format!("http://{}{sep}{}", self.host, req.url);
        }
        req
    }
}

/// The object this invocation runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThisObject {
    /// The class serving it.
    pub class: String,
    /// Its ID.
    pub id: ObjectId,
    /// The name its ID was made from, when the host knows it.
    pub name: Option<String>,
}

/// The object this invocation runs as, or `None` for a plain Worker
/// request.
pub fn this_object() -> Option<ThisObject> {
    wit::this_object().map(|o| ThisObject {
        class: o.class,
        id: ObjectId(o.id),
        name: o.name,
    })
}

/// The storage of the object the invocation runs as.
pub mod storage {
    use super::wit;

    /// Why a storage call failed.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum StorageError {
        /// The invocation is not an object's.
        NotAnObject,
        /// Over a limit (the message names it).
        Limit(String),
        /// A malformed call.
        Invalid(String),
        /// Another owner took the object over; this instance is being shut
        /// down.
        Superseded,
        /// The storage failed; nothing was written.
        Unavailable(String),
    }

    impl std::fmt::Display for StorageError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self {
                StorageError::NotAnObject => f.write_str("not running as a Durable Object"),
                StorageError::Limit(m) => write!(f, "storage limit: {m}"),
                StorageError::Invalid(m) => write!(f, "invalid storage call: {m}"),
                StorageError::Superseded => f.write_str("the object was taken over elsewhere"),
                StorageError::Unavailable(m) => write!(f, "storage unavailable: {m}"),
            }
        }
    }

    impl std::error::Error for StorageError {}

    impl From<wit::StorageError> for StorageError {
        fn from(e: wit::StorageError) -> Self {
            match e {
                wit::StorageError::NotAnObject => StorageError::NotAnObject,
                wit::StorageError::Limit(m) => StorageError::Limit(m),
                wit::StorageError::Invalid(m) => StorageError::Invalid(m),
                wit::StorageError::Superseded => StorageError::Superseded,
                wit::StorageError::Unavailable(m) => StorageError::Unavailable(m),
            }
        }
    }

    /// Which entries [`list`] returns (Cloudflare's options).
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct ListOptions {
        /// Keys from this one on.
        pub start: Option<String>,
        /// Keys after this one.
        pub start_after: Option<String>,
        /// Keys before this one.
        pub end: Option<String>,
        /// Keys that begin with this.
        pub prefix: Option<String>,
        /// Descending order.
        pub reverse: bool,
        /// At most this many.
        pub limit: Option<u32>,
    }

    /// The value of `key`.
    pub fn get(key: &str) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(get_many(&[key.to_owned()])?.pop().flatten())
    }

    /// The values of `keys`, in order.
    pub fn get_many(keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, StorageError> {
        Ok(wit::get(keys)?)
    }

    /// Writes `value` under `key`.
    pub fn put(key: &str, value: &[u8]) -> Result<(), StorageError> {
        put_many(&[(key.to_owned(), value.to_vec())])
    }

    /// Writes every entry, all or none.
    pub fn put_many(entries: &[(String, Vec<u8>)]) -> Result<(), StorageError> {
        Ok(wit::put(entries)?)
    }

    /// Deletes `key`; whether it had a value.
    pub fn delete(key: &str) -> Result<bool, StorageError> {
        Ok(delete_many(&[key.to_owned()])? > 0)
    }

    /// Deletes `keys`; how many had a value.
    pub fn delete_many(keys: &[String]) -> Result<u32, StorageError> {
        Ok(wit::delete(keys)?)
    }

    /// The entries `options` selects.
    pub fn list(options: &ListOptions) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        let o = wit::ListOptions {
            start: options.start.clone(),
            start_after: options.start_after.clone(),
            end: options.end.clone(),
            prefix: options.prefix.clone(),
            reverse: options.reverse,
            limit: options.limit,
        };
        Ok(wit::list(&o)?)
    }

    /// Deletes every key of the object.
    pub fn delete_all() -> Result<(), StorageError> {
        Ok(wit::delete_all()?)
    }

    /// Runs `f` in a transaction: its writes apply together if it returns
    /// `Ok`, and not at all if it returns `Err` (or the instance fails).
    pub fn transaction<T, E: From<StorageError>>(
        f: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        wit::transaction_begin().map_err(StorageError::from)?;
        match f() {
            Ok(v) => {
                wit::transaction_commit().map_err(StorageError::from)?;
                Ok(v)
            }
            Err(e) => {
                // The caller's error is the one to report.
                let _ = wit::transaction_rollback();
                Err(e)
            }
        }
    }

    /// Makes every write so far durable now.
    pub fn sync() -> Result<(), StorageError> {
        Ok(wit::sync()?)
    }

    /// When the object's alarm is due (milliseconds since the Unix epoch),
    /// or `None` when none is set.
    pub fn get_alarm() -> Result<Option<u64>, StorageError> {
        Ok(wit::get_alarm()?)
    }

    /// Sets the object's alarm to `at_ms` (milliseconds since the Unix
    /// epoch), replacing any earlier one. When it is due, hearth calls the
    /// object with a request [`super::alarm_info`] recognizes; a time in
    /// the past fires at once.
    pub fn set_alarm(at_ms: u64) -> Result<(), StorageError> {
        Ok(wit::set_alarm(at_ms)?)
    }

    /// Deletes the object's alarm, if one is set.
    pub fn delete_alarm() -> Result<(), StorageError> {
        Ok(wit::delete_alarm()?)
    }
}

/// The header of hearth's alarm call to an object: the retry count. Only
/// the host sets it (it is stripped from every other request).
pub const ALARM_HEADER: &str = "hearth-object-alarm";

/// What an alarm call tells its object (Cloudflare's `alarmInfo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlarmInfo {
    /// Tries of this alarm that failed before this one.
    pub retry_count: u32,
    /// Whether an earlier try failed (`retry_count > 0`).
    pub is_retry: bool,
}

/// `Some` when `req` is hearth's call of the object's alarm (set with
/// [`storage::set_alarm`]): the object runs its alarm work and answers a
/// 2xx status when it succeeded; any other answer is retried with backoff
/// (2 s, doubling, up to 6 retries). Once a 2xx is answered the alarm is
/// deleted, unless the object set another time.
pub fn alarm_info(req: &Request) -> Option<AlarmInfo> {
    let retry_count = req.header_value(ALARM_HEADER)?.trim().parse().ok()?;
    Some(AlarmInfo {
        retry_count,
        is_retry: retry_count > 0,
    })
}
