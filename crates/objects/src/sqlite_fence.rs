//! The embedded fence: heads in an SQLite file, for nodes on one machine
//! (`hearth cluster`, `hearth dev`, tests). SQLite's file locking makes the
//! compare-and-swap hold across processes: a claim is a read and a write
//! in one `BEGIN IMMEDIATE` transaction, an advance one conditional
//! `UPDATE`, a check one `SELECT` of the token. A busy timeout waits
//! out the other processes' transactions.
//!
//! Each row also holds the head's alarm time in an indexed `alarm` column,
//! written by the same statement as the head, so
//! [`Fence::due_alarms`] is one index range scan.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::error::ObjectsError;
use crate::fence::{Claim, Fence, Head, decode_head, encode_head};

/// How long a call waits for another process's transaction on the file.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Heads fenced in an SQLite file (table `heads`: key, version token,
/// head as JSON, alarm time). Any number of processes may open the same file.
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
        // Files made before alarms existed have no `alarm` column: add it
        // (their heads hold no alarm, so NULL is right for every row).
        let has_alarm: bool = conn
            .query_row(
                "SELECT COUNT(*) FROM pragma_table_info('heads') WHERE name = 'alarm'",
                [],
                |row| row.get::<_, i64>(0),
            )
            .map_err(fence_error)?
            > 0;
        if !has_alarm {
            conn.execute_batch("ALTER TABLE heads ADD COLUMN alarm INTEGER")
                .map_err(fence_error)?;
        }
        conn.execute_batch(
            "CREATE INDEX IF NOT EXISTS heads_alarm ON heads (alarm) WHERE alarm IS NOT NULL",
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

/// The `alarm` column of `head`'s row (SQLite integers are signed).
fn alarm_column(head: &Head) -> Result<Option<i64>, ObjectsError> {
    head.alarm
        .map(|at| {
            i64::try_from(at)
                .map_err(|_| ObjectsError::Invalid(format!("alarm time {at} out of range")))
        })
        .transpose()
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
                "INSERT INTO heads (key, token, head, alarm) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (key) DO UPDATE SET
                     token = excluded.token, head = excluded.head, alarm = excluded.alarm",
                params![key, token, json, alarm_column(&head)?],
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
        let alarm = alarm_column(head)?;
        let expected = i64::try_from(token)
            .map_err(|_| ObjectsError::Invalid(format!("fence token {token} out of range")))?;
        self.blocking(move |conn| {
            let changed = conn
                .execute(
                    "UPDATE heads SET token = token + 1, head = ?3, alarm = ?4
                     WHERE key = ?1 AND token = ?2",
                    params![key, expected, json, alarm],
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

    async fn due_alarms(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<(String, u64)>, ObjectsError> {
        let now = i64::try_from(now_ms).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.blocking(move |conn| {
            let mut select = conn
                .prepare_cached(
                    "SELECT key, alarm FROM heads
                     WHERE alarm IS NOT NULL AND alarm <= ?1
                     ORDER BY alarm LIMIT ?2",
                )
                .map_err(fence_error)?;
            let rows = select
                .query_map(params![now, limit], |row| {
                    Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
                })
                .map_err(fence_error)?;
            rows.map(|row| {
                row.map(|(key, at)| (key, at.unsigned_abs()))
                    .map_err(fence_error)
            })
            .collect()
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
