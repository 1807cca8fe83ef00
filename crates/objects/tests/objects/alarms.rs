//! Alarms in storage: a write like the others (visible at once, durable at
//! the next flush, undone by a rollback), kept across owners, and found by
//! `due_alarms` without opening objects, with the SQLite fence and etcd.

use std::sync::Arc;

use hearth_objects::{
    BlobStore, Fence, MemoryBlobStore, Namespace, ObjectKey, Objects, StorageError, StorageLimits,
};

use crate::support::{Etcd, Stores, counter, put};

fn node(fence: &Arc<dyn Fence>, blobs: &Arc<dyn BlobStore>) -> Objects {
    Objects::new(
        Arc::clone(fence),
        Arc::clone(blobs),
        StorageLimits::default(),
    )
}

/// The alarms due at `now_ms` (at most 10), as `objects` finds them.
async fn due(objects: &Objects, now_ms: u64) -> Vec<(String, u64)> {
    objects.due_alarms(now_ms, 10).await.expect("due")
}

fn other() -> ObjectKey {
    let namespace = Namespace::new("app", "Counter");
    let id = namespace.id_from_name("other");
    ObjectKey { namespace, id }
}

/// The alarm's life through flushes, rollbacks, a new owner and a
/// superseded one, and what `due_alarms` sees at each step.
async fn alarms_are_durable_fenced_and_found(fence: Arc<dyn Fence>, blobs: Arc<dyn BlobStore>) {
    let objects = node(&fence, &blobs);
    let ring_key = counter().ring_key();
    let mut a = objects.open(&counter()).await.expect("A opens");
    assert_eq!(a.get_alarm(), Ok(None));
    assert!(due(&objects, u64::MAX >> 2).await.is_empty());

    a.set_alarm(5_000).expect("set");
    assert_eq!(a.get_alarm(), Ok(Some(5_000)), "visible at once");
    assert!(a.has_unflushed(), "an alarm alone is a write to flush");
    assert!(
        due(&objects, 10_000).await.is_empty(),
        "not durable before the flush"
    );
    a.flush().await.expect("flush of the alarm alone");
    assert!(!a.has_unflushed());
    assert_eq!(a.head().alarm, Some(5_000));
    assert!(due(&objects, 4_999).await.is_empty(), "not due yet");
    assert_eq!(due(&objects, 5_000).await, vec![(ring_key.clone(), 5_000)]);

    // Replaced by a later set; undone by a rollback.
    a.transaction_begin().expect("begin");
    a.set_alarm(9_000).expect("set in a transaction");
    put(&mut a, "k", "v");
    assert_eq!(a.get_alarm(), Ok(Some(9_000)));
    a.transaction_rollback().expect("rollback");
    assert_eq!(
        a.get_alarm(),
        Ok(Some(5_000)),
        "rolled back with the transaction"
    );
    a.set_alarm(7_000).expect("set");
    put(&mut a, "k", "v");
    a.flush().await.expect("flush with a segment");
    assert_eq!(
        due(&objects, 8_000).await,
        vec![(ring_key.clone(), 7_000)],
        "one alarm per object: the set replaced the earlier one"
    );

    // A second object's alarm: earliest first, and the limit holds.
    let mut o = objects.open(&other()).await.expect("other opens");
    o.set_alarm(6_000).expect("set");
    o.flush().await.expect("flush");
    assert_eq!(
        due(&objects, 8_000).await,
        vec![(other().ring_key(), 6_000), (ring_key.clone(), 7_000)]
    );
    assert_eq!(objects.due_alarms(8_000, 1).await.expect("due").len(), 1);
    o.delete_alarm().expect("delete");
    o.flush().await.expect("flush of the deletion");
    assert_eq!(due(&objects, 8_000).await, vec![(ring_key.clone(), 7_000)]);

    // A new owner restores the alarm; the old one can no longer move it.
    let mut b = node(&fence, &blobs)
        .open(&counter())
        .await
        .expect("B opens");
    assert_eq!(b.get_alarm(), Ok(Some(7_000)));
    a.delete_alarm().expect("A's working copy changes");
    assert_eq!(a.flush().await, Err(StorageError::Superseded));
    assert_eq!(
        due(&objects, 8_000).await,
        vec![(ring_key.clone(), 7_000)],
        "a superseded owner's deletion never lands"
    );
    b.delete_alarm().expect("delete");
    b.flush().await.expect("flush");
    assert!(due(&objects, u64::MAX >> 2).await.is_empty());
    let mut c = node(&fence, &blobs)
        .open(&counter())
        .await
        .expect("C opens");
    assert_eq!(c.get_alarm(), Ok(None));
}

#[tokio::test]
async fn sqlite_fence_keeps_and_finds_alarms() {
    let stores = Stores::new();
    alarms_are_durable_fenced_and_found(Arc::clone(&stores.fence), Arc::clone(&stores.blobs)).await;
}

#[tokio::test]
async fn etcd_fence_keeps_and_finds_alarms() {
    let Some(etcd) = Etcd::start() else { return };
    alarms_are_durable_fenced_and_found(etcd.fence(), Arc::new(MemoryBlobStore::new())).await;
}

/// A fence file written before alarms existed (no `alarm` column, heads
/// without the field) opens, keeps its heads, and takes alarms.
#[tokio::test]
async fn a_fence_file_from_before_alarms_opens() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("fence.sqlite");
    {
        let conn = rusqlite::Connection::open(&path).expect("old file");
        conn.execute_batch(
            "CREATE TABLE heads (key TEXT PRIMARY KEY NOT NULL, token INTEGER NOT NULL, head TEXT NOT NULL);
             INSERT INTO heads VALUES ('do:x', 3, '{\"epoch\":2,\"snapshot\":null,\"segments\":[],\"bytes\":0}');",
        )
        .expect("old schema");
    }
    let fence = hearth_objects::SqliteFence::open(&path).expect("opens");
    let claim = fence.claim("do:x").await.expect("claim");
    assert_eq!(claim.head.epoch, 3);
    assert_eq!(claim.head.alarm, None);
    let mut head = claim.head.clone();
    head.alarm = Some(42);
    fence
        .advance("do:x", claim.token, &head)
        .await
        .expect("advance");
    assert_eq!(
        fence.due_alarms(100, 10).await.expect("due"),
        vec![("do:x".to_owned(), 42)]
    );
}
