//! The embedded fence: heads in an SQLite file, for nodes on one machine
//! (`hearth cluster`, `hearth dev`, tests). SQLite's file locking makes the
//! compare-and-swap hold across processes: a claim is a read and a write
//! in one `BEGIN IMMEDIATE` transaction, an advance one conditional
//! `UPDATE`, a check one `SELECT` of the token. A busy timeout waits out the other processes' transactions.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::error::ObjectsError;
use crate::fence::{Claim, Fence, Head, decode_head, encode_head};

/// How long a call waits for another process's transaction on the file.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Heads fenced in an SQLite file (table `heads`: key, version token,
/// head as JSON). Any number of processes may open the same file.
#[derive(Clone)]
pub struct SqliteFence {
    conn: Arc<Mutex<Connection>>,
}

impl std::fmt::Debug for SqliteFence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteFence").finish_non_exhaustive()
    }
}

impl SqliteFence {
    /// Opens (creating if needed) the fence file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ObjectsError> {
        let conn = Connection::open(path.as_ref()).map_err(fence_error)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(fence_error)?;
        // WAL: readers and the one writer do not block each other, and a
        // commit is one append (synced: FULL keeps a committed head across
        // a power loss, not only a process crash).
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(fence_error)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(fence_error)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS heads (
                 key TEXT PRIMARY KEY NOT NULL,
                 token INTEGER NOT NULL,
                 head TEXT NOT NULL
             )",
        )
        .map_err(fence_error)?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Runs `call` on the connection in the blocking pool (SQLite may wait
    /// on another process's lock for up to the busy timeout).
    async fn blocking<T: Send + 'static>(
        &self,
        call: impl FnOnce(&mut Connection) -> Result<T, ObjectsError> + Send + 'static,
    ) -> Result<T, ObjectsError> {
        let conn = Arc::clone(&self.conn);
        tokio::task::spawn_blocking(move || {
            // A panic mid-call leaves no transaction open (rusqlite rolls
            // back on drop), so a poisoned lock is still usable.
            let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            call(&mut conn)
        })
        .await
        .map_err(|e| ObjectsError::Fence(format!("fence call failed: {e}")))?
    }
}

fn fence_error(error: rusqlite::Error) -> ObjectsError {
    ObjectsError::Fence(error.to_string())
}

#[async_trait::async_trait]
impl Fence for SqliteFence {
    async fn claim(&self, key: &str) -> Result<Claim, ObjectsError> {
        let key = key.to_owned();
        self.blocking(move |conn| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(fence_error)?;
            let stored: Option<(i64, String)> = tx
                .query_row(
                    "SELECT token, head FROM heads WHERE key = ?1",
                    [&key],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .optional()
                .map_err(fence_error)?;
            let (token, mut head) = match stored {
                Some((token, head)) => (token, decode_head(head.as_bytes())?),
                None => (0, Head::default()),
            };
            head.epoch += 1;
            let token = token + 1;
            let json = encode_head(&head)?;
            tx.execute(
                "INSERT INTO heads (key, token, head) VALUES (?1, ?2, ?3)
                 ON CONFLICT (key) DO UPDATE SET token = excluded.token, head = excluded.head",
                params![key, token, json],
            )
            .map_err(fence_error)?;
            tx.commit().map_err(fence_error)?;
            Ok(Claim {
                head,
                token: token.unsigned_abs(),
            })
        })
        .await
    }

    async fn advance(&self, key: &str, token: u64, head: &Head) -> Result<u64, ObjectsError> {
        let key = key.to_owned();
        let json = encode_head(head)?;
        let expected = i64::try_from(token)
            .map_err(|_| ObjectsError::Invalid(format!("fence token {token} out of range")))?;
        self.blocking(move |conn| {
            let changed = conn
                .execute(
                    "UPDATE heads SET token = token + 1, head = ?3 WHERE key = ?1 AND token = ?2",
                    params![key, expected, json],
                )
                .map_err(fence_error)?;
            if changed == 1 {
                Ok(token + 1)
            } else {
                Err(ObjectsError::Superseded)
            }
        })
        .await
    }

    async fn check(&self, key: &str, token: u64) -> Result<(), ObjectsError> {
        let key = key.to_owned();
        self.blocking(move |conn| {
            let stored: Option<i64> = conn
                .prepare_cached("SELECT token FROM heads WHERE key = ?1")
                .and_then(|mut select| select.query_row([&key], |row| row.get(0)).optional())
                .map_err(fence_error)?;
            if stored.and_then(|t| u64::try_from(t).ok()) == Some(token) {
                Ok(())
            } else {
                Err(ObjectsError::Superseded)
            }
        })
        .await
    }
}
