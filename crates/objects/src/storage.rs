//! One object's storage: the in-memory SQLite working copy, its limits,
//! its transactions, and the flush that makes its writes durable.
//!
//! Keys are stored as BLOBs, so SQLite compares them bytewise: the UTF-8
//! order Cloudflare lists keys in. Every batch runs inside a savepoint, so a
//! batch that breaks a limit halfway leaves nothing behind.
//!
//! The object's alarm (one time, or none) is a write like the others: set
//! or deleted in the working state at once, undone by a transaction's
//! rollback, and durable at the next flush, which carries it in the head
//! ([`Head::alarm`]) by the same compare-and-swap as the key-value writes.

use std::sync::Arc;

use rusqlite::{Connection, OptionalExtension, params};

use crate::blob::{BlobStore, blob_hash};
use crate::error::{ObjectsError, StorageError};
use crate::fence::{BlobRef, Claim, Fence, Head};
use crate::segment::{self, Op};

/// A flush compacts once the segments weigh more than this and more than
/// the snapshot (see [`crate::COMPACT_AFTER_SEGMENTS`] for the count).
const COMPACT_MIN_SEGMENT_BYTES: u64 = 1 << 20;

/// Limits on one object's storage: Cloudflare's numbers by default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageLimits {
    /// Largest key, in bytes of UTF-8 (Cloudflare: 2 KiB).
    pub max_key_bytes: usize,
    /// Largest value, in bytes (Cloudflare: 128 KiB).
    pub max_value_bytes: usize,
    /// Most keys in one `get`, `put` or `delete` (Cloudflare: 128).
    pub max_batch_keys: usize,
    /// Most bytes (keys plus values) one object may store. Configurable
    /// per node; 64 MiB by default.
    pub max_object_bytes: u64,
}

impl Default for StorageLimits {
    fn default() -> Self {
        Self {
            max_key_bytes: 2048,
            max_value_bytes: 128 * 1024,
            max_batch_keys: 128,
            max_object_bytes: 64 * 1024 * 1024,
        }
    }
}

/// Which keys [`ObjectStorage::list`] returns, as Cloudflare's
/// `storage.list()` options: keys in `[start, end)` (or after
/// `start_after`) that begin with `prefix`, in UTF-8 order (descending with
/// `reverse`), at most `limit` of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListOptions {
    /// Only keys that begin with this.
    pub prefix: Option<String>,
    /// Only keys at or after this one (not with `start_after`).
    pub start: Option<String>,
    /// Only keys strictly after this one (not with `start`).
    pub start_after: Option<String>,
    /// Only keys strictly before this one.
    pub end: Option<String>,
    /// At most this many pairs (positive); all of them when `None`.
    pub limit: Option<u32>,
    /// Descending order: with `limit`, the last keys of the range.
    pub reverse: bool,
}

/// An open transaction: the writes it made so far and the byte count to
/// return to on rollback.
#[derive(Debug)]
struct Transaction {
    ops: Vec<Op>,
    bytes_at_begin: u64,
    alarm_at_begin: Option<u64>,
}

/// One resident object's storage, owned by the node that opened it
/// ([`crate::Objects::open`]). `&mut self` everywhere: one request at a
/// time, as the host's input gate runs them.
///
/// Writes are visible at once; [`ObjectStorage::flush`] makes them durable.
pub struct ObjectStorage {
    ring_key: String,
    conn: Connection,
    limits: StorageLimits,
    fence: Arc<dyn Fence>,
    blobs: Arc<dyn BlobStore>,
    /// The head the fence holds for this owner (as of the last flush).
    head: Head,
    /// The fence's version of `head`: what the next advance presents.
    token: u64,
    /// Committed writes since the last flush, in order.
    pending: Vec<Op>,
    transaction: Option<Transaction>,
    /// Bytes (keys plus values) stored now, in the working copy.
    bytes: u64,
    /// The alarm as the object sees it now (milliseconds since the Unix
    /// epoch), flushed or not.
    alarm: Option<u64>,
    /// Set once a flush learned of a newer owner: every call fails then.
    superseded: bool,
}

impl std::fmt::Debug for ObjectStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectStorage")
            .field("ring_key", &self.ring_key)
            .field("epoch", &self.head.epoch)
            .field("bytes", &self.bytes)
            .field("pending", &self.pending.len())
            .field("superseded", &self.superseded)
            .finish_non_exhaustive()
    }
}

impl ObjectStorage {
    /// The working copy rebuilt from a claim's head: its snapshot, then its
    /// segments in order. The byte count must match the head's.
    pub(crate) fn restore(
        ring_key: String,
        claim: Claim,
        snapshot: Option<&[u8]>,
        segments: &[Vec<u8>],
        limits: StorageLimits,
        fence: Arc<dyn Fence>,
        blobs: Arc<dyn BlobStore>,
    ) -> Result<Self, ObjectsError> {
        let mut conn = Connection::open_in_memory()?;
        match snapshot {
            Some(bytes) => {
                conn.deserialize_read_exact(rusqlite::MAIN_DB, bytes, bytes.len(), false)?;
            }
            None => conn.execute_batch(
                "CREATE TABLE kv (key BLOB PRIMARY KEY NOT NULL, value BLOB NOT NULL) WITHOUT ROWID",
            )?,
        }
        let tx = conn.transaction()?;
        for blob in segments {
            for op in segment::decode(blob)? {
                apply(&tx, &op)?;
            }
        }
        tx.commit()?;
        let bytes = stored_bytes(&conn)?;
        if bytes != claim.head.bytes {
            return Err(ObjectsError::Corrupt(format!(
                "{ring_key}: restored {bytes} bytes, its head says {}",
                claim.head.bytes
            )));
        }
        let alarm = claim.head.alarm;
        Ok(Self {
            ring_key,
            conn,
            limits,
            fence,
            blobs,
            head: claim.head,
            token: claim.token,
            pending: Vec::new(),
            transaction: None,
            bytes,
            alarm,
            superseded: false,
        })
    }

    /// The owner's epoch (the claim's): greater than every earlier owner's.
    pub fn epoch(&self) -> u64 {
        self.head.epoch
    }

    /// The head as of the last successful flush (or the claim): which
    /// snapshot and segments hold the object's durable state.
    pub fn head(&self) -> &Head {
        &self.head
    }

    /// Bytes (keys plus values) the object stores now, flushed or not.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The values of `keys`, in order (`None` for a key that holds nothing).
    pub fn get(&mut self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, StorageError> {
        self.check_live()?;
        self.check_batch(keys.len())?;
        keys.iter().try_for_each(|key| self.check_key(key))?;
        let mut select = self
            .conn
            .prepare_cached("SELECT value FROM kv WHERE key = ?1")?;
        let mut values = Vec::with_capacity(keys.len());
        for key in keys {
            values.push(
                select
                    .query_row([key.as_bytes()], |row| row.get(0))
                    .optional()?,
            );
        }
        Ok(values)
    }

    /// Stores each `(key, value)` pair, in order (a later pair for the same
    /// key wins). All or nothing: a pair that breaks a limit leaves the
    /// storage as it was.
    pub fn put(&mut self, entries: Vec<(String, Vec<u8>)>) -> Result<(), StorageError> {
        self.check_live()?;
        self.check_batch(entries.len())?;
        for (key, value) in &entries {
            self.check_key(key)?;
            if value.len() > self.limits.max_value_bytes {
                return Err(StorageError::Limit(format!(
                    "value of {key:?} is {} bytes; max_value_bytes is {}",
                    value.len(),
                    self.limits.max_value_bytes
                )));
            }
        }
        let max = self.limits.max_object_bytes;
        let bytes = self.in_savepoint(|conn, mut bytes| {
            for (key, value) in &entries {
                bytes = bytes.saturating_sub(old_size(conn, key)?.unwrap_or(0));
                bytes += size(key, value);
                apply(conn, &Op::Put(key.clone(), value.clone()))?;
            }
            if bytes > max {
                return Err(StorageError::Limit(format!(
                    "the object would store {bytes} bytes; max_object_bytes is {max}"
                )));
            }
            Ok(bytes)
        })?;
        self.bytes = bytes;
        for (key, value) in entries {
            self.record(Op::Put(key, value));
        }
        Ok(())
    }

    /// Deletes `keys`; returns how many of them held a value.
    pub fn delete(&mut self, keys: &[String]) -> Result<u32, StorageError> {
        self.check_live()?;
        self.check_batch(keys.len())?;
        keys.iter().try_for_each(|key| self.check_key(key))?;
        let mut deleted = Vec::new();
        let bytes = self.in_savepoint(|conn, mut bytes| {
            for key in keys {
                if let Some(old) = old_size(conn, key)? {
                    bytes = bytes.saturating_sub(old);
                    apply(conn, &Op::Delete(key.clone()))?;
                    deleted.push(key.clone());
                }
            }
            Ok(bytes)
        })?;
        self.bytes = bytes;
        let count = u32::try_from(deleted.len()).unwrap_or(u32::MAX);
        for key in deleted {
            self.record(Op::Delete(key));
        }
        Ok(count)
    }

    /// The pairs `options` selects, in key order (descending with
    /// `reverse`). `start` with `start_after`, or a zero `limit`, is
    /// [`StorageError::Invalid`].
    pub fn list(&mut self, options: &ListOptions) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        self.check_live()?;
        if options.start.is_some() && options.start_after.is_some() {
            return Err(StorageError::Invalid(
                "list: start and start_after cannot both be given".to_owned(),
            ));
        }
        if options.limit == Some(0) {
            return Err(StorageError::Invalid(
                "list: limit must be a positive number".to_owned(),
            ));
        }
        let mut conditions = Vec::new();
        let mut bounds: Vec<Vec<u8>> = Vec::new();
        let mut bound = |condition: &str, value: Vec<u8>| {
            bounds.push(value);
            conditions.push(format!("key {condition} ?{}", bounds.len()));
        };
        if let Some(start) = &options.start {
            bound(">=", start.as_bytes().to_vec());
        }
        if let Some(after) = &options.start_after {
            bound(">", after.as_bytes().to_vec());
        }
        if let Some(end) = &options.end {
            bound("<", end.as_bytes().to_vec());
        }
        if let Some(prefix) = &options.prefix {
            bound(">=", prefix.as_bytes().to_vec());
            if let Some(successor) = prefix_successor(prefix.as_bytes()) {
                bound("<", successor);
            }
        }
        let mut sql = "SELECT key, value FROM kv".to_owned();
        if !conditions.is_empty() {
            sql.push_str(" WHERE ");
            sql.push_str(&conditions.join(" AND "));
        }
        sql.push_str(if options.reverse {
            " ORDER BY key DESC"
        } else {
            " ORDER BY key ASC"
        });
        // The limit is bound, not written into the SQL, so the statement
        // cache holds one statement per shape of options; -1 is no limit.
        sql.push_str(&format!(" LIMIT ?{}", bounds.len() + 1));
        let limit = options.limit.map_or(-1, i64::from);
        let mut select = self.conn.prepare_cached(&sql)?;
        let mut values: Vec<rusqlite::types::Value> = bounds
            .into_iter()
            .map(rusqlite::types::Value::Blob)
            .collect();
        values.push(rusqlite::types::Value::Integer(limit));
        let rows = select.query_map(rusqlite::params_from_iter(values), |row| {
            Ok((row.get::<_, Vec<u8>>(0)?, row.get::<_, Vec<u8>>(1)?))
        })?;
        let mut pairs = Vec::new();
        for row in rows {
            let (key, value) = row?;
            let key = String::from_utf8(key).map_err(|_| {
                StorageError::Unavailable("working copy: a stored key is not UTF-8".to_owned())
            })?;
            pairs.push((key, value));
        }
        Ok(pairs)
    }

    /// Deletes every key.
    pub fn delete_all(&mut self) -> Result<(), StorageError> {
        self.check_live()?;
        apply(&self.conn, &Op::DeleteAll)?;
        self.bytes = 0;
        // Nothing written before a delete-all matters after it.
        match &mut self.transaction {
            Some(transaction) => transaction.ops.clear(),
            None => self.pending.clear(),
        }
        self.record(Op::DeleteAll);
        Ok(())
    }

    /// Opens a transaction: until [`ObjectStorage::transaction_commit`] or
    /// [`ObjectStorage::transaction_rollback`], writes can still be undone
    /// and a flush leaves them out. Transactions do not nest.
    pub fn transaction_begin(&mut self) -> Result<(), StorageError> {
        self.check_live()?;
        if self.transaction.is_some() {
            return Err(StorageError::Invalid(
                "a transaction is already open (transactions do not nest)".to_owned(),
            ));
        }
        self.conn.execute_batch("BEGIN")?;
        self.transaction = Some(Transaction {
            ops: Vec::new(),
            bytes_at_begin: self.bytes,
            alarm_at_begin: self.alarm,
        });
        Ok(())
    }

    /// Commits the open transaction: its writes join those the next flush
    /// makes durable.
    pub fn transaction_commit(&mut self) -> Result<(), StorageError> {
        let transaction = self.end_transaction("COMMIT")?;
        if transaction.ops.first() == Some(&Op::DeleteAll) {
            self.pending.clear();
        }
        self.pending.extend(transaction.ops);
        Ok(())
    }

    /// Undoes the open transaction's writes.
    pub fn transaction_rollback(&mut self) -> Result<(), StorageError> {
        let transaction = self.end_transaction("ROLLBACK")?;
        self.bytes = transaction.bytes_at_begin;
        self.alarm = transaction.alarm_at_begin;
        Ok(())
    }

    /// When the object's alarm is due (milliseconds since the Unix epoch),
    /// or `None` when no alarm is set.
    pub fn get_alarm(&mut self) -> Result<Option<u64>, StorageError> {
        self.check_live()?;
        Ok(self.alarm)
    }

    /// Sets the object's alarm to `at_ms` (milliseconds since the Unix
    /// epoch), replacing any earlier one: an object has one alarm. A time
    /// in the past is due at once.
    pub fn set_alarm(&mut self, at_ms: u64) -> Result<(), StorageError> {
        self.check_live()?;
        if i64::try_from(at_ms).is_err() {
            return Err(StorageError::Invalid(format!(
                "alarm time {at_ms} is out of range"
            )));
        }
        self.alarm = Some(at_ms);
        Ok(())
    }

    /// Deletes the object's alarm, if one is set.
    pub fn delete_alarm(&mut self) -> Result<(), StorageError> {
        self.check_live()?;
        self.alarm = None;
        Ok(())
    }

    /// The alarm as of the last committed write: an open transaction's
    /// change is not flushed.
    fn committed_alarm(&self) -> Option<u64> {
        self.transaction
            .as_ref()
            .map_or(self.alarm, |transaction| transaction.alarm_at_begin)
    }

    /// Ends the open transaction with `statement` (COMMIT or ROLLBACK);
    /// it stays open if SQLite refuses.
    fn end_transaction(&mut self, statement: &str) -> Result<Transaction, StorageError> {
        self.check_live()?;
        let Some(transaction) = self.transaction.take() else {
            return Err(StorageError::Invalid("no transaction is open".to_owned()));
        };
        if let Err(error) = self.conn.execute_batch(statement) {
            self.transaction = Some(transaction);
            return Err(error.into());
        }
        Ok(transaction)
    }

    /// Whether committed writes wait for a flush.
    pub fn has_unflushed(&self) -> bool {
        !self.pending.is_empty() || self.committed_alarm() != self.head.alarm
    }

    /// The output gate: makes every committed write durable. The writes
    /// become a segment (or, past [`crate::COMPACT_AFTER_SEGMENTS`]
    /// segments or when segments outweigh the snapshot, a new snapshot) in
    /// the blob store, then the object's head is advanced in the fence by
    /// compare-and-swap, which is the commit point.
    ///
    /// [`StorageError::Superseded`]: another owner claimed the object;
    /// nothing was written into the head and the instance must be
    /// discarded (every later call fails the same way).
    /// [`StorageError::Unavailable`]: the stores failed; the writes stay
    /// pending and the next flush retries them. (If the answer was lost but
    /// the advance did land, the next flush finds the fence moved and
    /// reports `Superseded`: the instance is discarded, and the next owner
    /// restores the head that landed. Never a write applied twice or lost
    /// after an `Ok`.)
    pub async fn flush(&mut self) -> Result<(), StorageError> {
        self.check_live()?;
        if !self.has_unflushed() {
            return Ok(());
        }
        if self.pending.is_empty() {
            // Only the alarm changed: a new head, no blob.
            let mut head = self.head.clone();
            head.alarm = self.committed_alarm();
            return self.advance(head).await;
        }
        let segment = segment::encode(&self.pending)?;
        let segment_bytes: u64 =
            self.head.segments.iter().map(|s| s.len).sum::<u64>() + segment.len() as u64;
        let snapshot_bytes = self.head.snapshot.as_ref().map_or(0, |s| s.len);
        // A snapshot is of the whole database, so not while a transaction's
        // uncommitted writes are in it.
        let compact = self.transaction.is_none()
            && (self.head.segments.len() >= crate::COMPACT_AFTER_SEGMENTS
                || segment_bytes > snapshot_bytes.max(COMPACT_MIN_SEGMENT_BYTES));
        let mut head = self.head.clone();
        head.alarm = self.committed_alarm();
        // The committed bytes: an open transaction's writes are not flushed.
        head.bytes = self
            .transaction
            .as_ref()
            .map_or(self.bytes, |transaction| transaction.bytes_at_begin);
        if compact {
            let snapshot = self.conn.serialize(rusqlite::MAIN_DB)?.to_vec();
            head.snapshot = Some(put_blob(self.blobs.as_ref(), &snapshot).await?);
            head.segments.clear();
        } else {
            head.segments
                .push(put_blob(self.blobs.as_ref(), &segment).await?);
        }
        self.advance(head).await
    }

    /// Advances the fence to `head` (the commit point of a flush): on
    /// success it is the head, and the pending writes are durable.
    async fn advance(&mut self, head: Head) -> Result<(), StorageError> {
        match self.fence.advance(&self.ring_key, self.token, &head).await {
            Ok(token) => {
                self.head = head;
                self.token = token;
                self.pending.clear();
                Ok(())
            }
            Err(ObjectsError::Superseded) => {
                self.superseded = true;
                Err(StorageError::Superseded)
            }
            Err(other) => Err(other.into()),
        }
    }

    /// The output gate of a response: confirms that this storage's owner
    /// still owns the object, so what it answers from the working copy is
    /// not stale. With writes pending it flushes them (the head's
    /// compare-and-swap confirms ownership as it commits); with none it
    /// asks the fence whether the head is still at this owner's version
    /// (one read, [`Fence::check`]).
    ///
    /// [`StorageError::Superseded`]: another owner claimed the object
    /// since; nothing this owner read may be answered, and the instance
    /// must be discarded (every later call fails the same way).
    /// [`StorageError::Unavailable`]: the fence could not say; ownership is
    /// not confirmed.
    pub async fn confirm(&mut self) -> Result<(), StorageError> {
        self.check_live()?;
        if !self.pending.is_empty() {
            return self.flush().await;
        }
        match self.fence.check(&self.ring_key, self.token).await {
            Ok(()) => Ok(()),
            Err(ObjectsError::Superseded) => {
                self.superseded = true;
                Err(StorageError::Superseded)
            }
            Err(other) => Err(other.into()),
        }
    }

    /// Whether this storage learned (from a flush or a confirm) that
    /// another owner claimed the object: it never serves again.
    pub fn is_superseded(&self) -> bool {
        self.superseded
    }

    fn check_live(&self) -> Result<(), StorageError> {
        if self.superseded {
            Err(StorageError::Superseded)
        } else {
            Ok(())
        }
    }

    fn check_batch(&self, keys: usize) -> Result<(), StorageError> {
        if keys > self.limits.max_batch_keys {
            return Err(StorageError::Limit(format!(
                "{keys} keys in one call; max_batch_keys is {}",
                self.limits.max_batch_keys
            )));
        }
        Ok(())
    }

    fn check_key(&self, key: &str) -> Result<(), StorageError> {
        if key.len() > self.limits.max_key_bytes {
            return Err(StorageError::Limit(format!(
                "a key is {} bytes; max_key_bytes is {}",
                key.len(),
                self.limits.max_key_bytes
            )));
        }
        Ok(())
    }

    /// Runs `batch` (given the byte count, returning the new one) inside a
    /// savepoint: released on `Ok`, rolled back on `Err`.
    fn in_savepoint(
        &mut self,
        batch: impl FnOnce(&Connection, u64) -> Result<u64, StorageError>,
    ) -> Result<u64, StorageError> {
        self.conn.execute_batch("SAVEPOINT batch")?;
        match batch(&self.conn, self.bytes) {
            Ok(bytes) => {
                self.conn.execute_batch("RELEASE batch")?;
                Ok(bytes)
            }
            Err(error) => {
                self.conn
                    .execute_batch("ROLLBACK TO batch; RELEASE batch")?;
                Err(error)
            }
        }
    }

    fn record(&mut self, op: Op) {
        match &mut self.transaction {
            Some(transaction) => transaction.ops.push(op),
            None => self.pending.push(op),
        }
    }
}

/// Applies one write to the working copy.
fn apply(conn: &Connection, op: &Op) -> rusqlite::Result<()> {
    match op {
        Op::Put(key, value) => conn
            .prepare_cached("INSERT OR REPLACE INTO kv (key, value) VALUES (?1, ?2)")?
            .execute(params![key.as_bytes(), value])?,
        Op::Delete(key) => conn
            .prepare_cached("DELETE FROM kv WHERE key = ?1")?
            .execute([key.as_bytes()])?,
        Op::DeleteAll => conn.prepare_cached("DELETE FROM kv")?.execute([])?,
    };
    Ok(())
}

/// What a stored pair counts against `max_object_bytes`.
fn size(key: &str, value: &[u8]) -> u64 {
    (key.len() + value.len()) as u64
}

/// The size of the pair `key` holds now, `None` if it holds nothing.
fn old_size(conn: &Connection, key: &str) -> rusqlite::Result<Option<u64>> {
    let value_len: Option<i64> = conn
        .prepare_cached("SELECT length(value) FROM kv WHERE key = ?1")?
        .query_row([key.as_bytes()], |row| row.get(0))
        .optional()?;
    Ok(value_len.map(|len| key.len() as u64 + len.unsigned_abs()))
}

/// Bytes (keys plus values) the working copy holds.
fn stored_bytes(conn: &Connection) -> rusqlite::Result<u64> {
    let total: i64 = conn.query_row(
        "SELECT COALESCE(SUM(length(key) + length(value)), 0) FROM kv",
        [],
        |row| row.get(0),
    )?;
    Ok(total.unsigned_abs())
}

/// The least byte string greater than every string that begins with
/// `prefix`, or `None` if there is none (an empty or all-0xFF prefix).
fn prefix_successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut successor = prefix.to_vec();
    while let Some(last) = successor.pop() {
        if last < u8::MAX {
            successor.push(last + 1);
            return Some(successor);
        }
    }
    None
}

/// Stores `bytes` in `blobs` under their hash. A free function, not a
/// method: `flush` must not hold `&ObjectStorage` across an await, or its
/// future is not `Send` (the working copy's connection is not `Sync`), and
/// the host flushes from tokio tasks.
async fn put_blob(blobs: &dyn BlobStore, bytes: &[u8]) -> Result<BlobRef, StorageError> {
    let hash = blob_hash(bytes);
    blobs.put(&hash, bytes).await?;
    Ok(BlobRef {
        hash,
        len: bytes.len() as u64,
    })
}

/// `flush`'s and `confirm`'s futures are `Send`: checked at compile time.
const _: fn(&mut ObjectStorage) = |storage| {
    fn send<T: Send>(_: T) {}
    send(storage.flush());
    send(storage.confirm());
};
