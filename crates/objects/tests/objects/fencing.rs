//! Fencing: a superseded owner's flush fails and never reaches the head,
//! in one process, across two OS processes sharing an SQLite fence file,
//! and with etcd.

use std::sync::Arc;

use hearth_objects::{
    BlobStore, Fence, MemoryBlobStore, Objects, ObjectsError, StorageError, StorageLimits,
};

use crate::support::{
    CHILD_DIR, CHILD_FENCE, Etcd, Stores, counter, dir_blobs, fence_from_spec, put, signal,
    spawn_child, text, wait_for_file,
};

/// Owner A flushes; owner B claims; A's next flush is Superseded and
/// neither B nor a later owner ever sees A's late write.
async fn superseded_owner_cannot_write(fence: Arc<dyn Fence>, blobs: Arc<dyn BlobStore>) {
    let node = |fence: &Arc<dyn Fence>| {
        Objects::new(
            Arc::clone(fence),
            Arc::clone(&blobs),
            StorageLimits::default(),
        )
    };
    let mut a = node(&fence).open(&counter()).await.expect("A opens");
    put(&mut a, "n", "1");
    a.flush().await.expect("A's flush as owner");

    let mut b = node(&fence).open(&counter()).await.expect("B opens");
    assert!(b.epoch() > a.epoch());
    assert_eq!(
        text(&mut b, "n").as_deref(),
        Some("1"),
        "B restores A's flushed write"
    );

    // A still believes it owns the object.
    put(&mut a, "n", "late from A");
    put(&mut a, "only-a", "x");
    assert_eq!(a.flush().await, Err(StorageError::Superseded));
    // Once superseded, always: a retry does not sneak the write in.
    assert_eq!(a.flush().await, Err(StorageError::Superseded));
    assert_eq!(a.get(&["n".to_owned()]), Err(StorageError::Superseded));

    put(&mut b, "n", "2");
    b.flush().await.expect("B's flush");
    assert_eq!(text(&mut b, "only-a"), None);

    let mut c = node(&fence).open(&counter()).await.expect("C opens");
    assert_eq!(text(&mut c, "n").as_deref(), Some("2"));
    assert_eq!(text(&mut c, "only-a"), None);
    // B, superseded in turn by C, cannot write either.
    put(&mut b, "n", "late from B");
    assert_eq!(b.flush().await, Err(StorageError::Superseded));
    drop(c);
    let mut d = node(&fence).open(&counter()).await.expect("D opens");
    assert_eq!(text(&mut d, "n").as_deref(), Some("2"));
}

#[tokio::test]
async fn sqlite_fence_supersedes_the_old_owner() {
    let stores = Stores::new();
    superseded_owner_cannot_write(Arc::clone(&stores.fence), Arc::clone(&stores.blobs)).await;
}

#[tokio::test]
async fn sqlite_fence_with_two_connections_to_one_file() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("fence.sqlite");
    let blobs: Arc<dyn BlobStore> = Arc::new(MemoryBlobStore::new());
    let node_a = Objects::new(
        fence_from_spec(&format!("sqlite:{}", path.display())),
        Arc::clone(&blobs),
        StorageLimits::default(),
    );
    let node_b = Objects::new(
        fence_from_spec(&format!("sqlite:{}", path.display())),
        Arc::clone(&blobs),
        StorageLimits::default(),
    );
    let mut a = node_a.open(&counter()).await.expect("A opens");
    put(&mut a, "n", "1");
    a.flush().await.expect("A flushes");
    let mut b = node_b.open(&counter()).await.expect("B opens");
    put(&mut a, "n", "late");
    assert_eq!(a.flush().await, Err(StorageError::Superseded));
    assert_eq!(text(&mut b, "n").as_deref(), Some("1"));
}

#[tokio::test]
async fn etcd_fence_supersedes_the_old_owner() {
    let Some(etcd) = Etcd::start() else { return };
    superseded_owner_cannot_write(etcd.fence(), Arc::new(MemoryBlobStore::new())).await;
}

/// Many nodes claim one object at once: every claim gets its own epoch,
/// and only the last claimant can flush.
async fn concurrent_claims_get_distinct_epochs(fence: Arc<dyn Fence>) {
    let blobs: Arc<dyn BlobStore> = Arc::new(MemoryBlobStore::new());
    let mut opens = Vec::new();
    for _ in 0..8 {
        let node = Objects::new(
            Arc::clone(&fence),
            Arc::clone(&blobs),
            StorageLimits::default(),
        );
        opens.push(tokio::spawn(async move { node.open(&counter()).await }));
    }
    let mut owners = Vec::new();
    for open in opens {
        owners.push(open.await.expect("task").expect("open"));
    }
    let mut epochs: Vec<u64> = owners.iter().map(|o| o.epoch()).collect();
    epochs.sort_unstable();
    epochs.dedup();
    assert_eq!(epochs.len(), 8, "every claim has its own epoch");
    let mut flushed = 0;
    for owner in &mut owners {
        put(owner, "n", &owner.epoch().to_string());
        match owner.flush().await {
            Ok(()) => flushed += 1,
            Err(StorageError::Superseded) => {}
            Err(other) => panic!("flush failed: {other}"),
        }
    }
    assert_eq!(flushed, 1, "only the newest owner can flush");
    let last = epochs.last().copied().expect("8 epochs");
    let winner = owners
        .iter_mut()
        .find(|o| o.epoch() == last)
        .expect("the newest owner");
    assert!(!winner.has_unflushed(), "the newest owner flushed");
}

#[tokio::test]
async fn sqlite_fence_concurrent_claims() {
    let stores = Stores::new();
    concurrent_claims_get_distinct_epochs(Arc::clone(&stores.fence)).await;
}

#[tokio::test]
async fn etcd_fence_concurrent_claims() {
    let Some(etcd) = Etcd::start() else { return };
    concurrent_claims_get_distinct_epochs(etcd.fence()).await;
}

/// The two-process version: this process is owner B, a re-executed copy of
/// the test binary (running only `test`) is owner A.
async fn across_processes(test: &str, fence_spec: &str) {
    let shared = tempfile::tempdir().expect("shared directory");
    let dir = shared.path();
    let mut child = spawn_child(test, fence_spec, dir);
    wait_for_file(&signal(dir, "a-flushed"), Some(&mut child)).await;

    let node = Objects::new(
        fence_from_spec(fence_spec),
        dir_blobs(dir),
        StorageLimits::default(),
    );
    let mut b = node.open(&counter()).await.expect("B opens");
    assert_eq!(text(&mut b, "n").as_deref(), Some("from A"));
    put(&mut b, "n", "from B");
    b.flush().await.expect("B flushes");
    std::fs::write(signal(dir, "b-claimed"), b"").expect("signal A");

    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("task")
        .expect("waiting for A");
    assert!(status.success(), "owner A's process failed: {status}");
    assert!(signal(dir, "a-superseded").exists());

    let mut c = node.open(&counter()).await.expect("C opens");
    assert_eq!(text(&mut c, "n").as_deref(), Some("from B"));
    assert_eq!(text(&mut c, "only-a"), None, "A's late write never landed");
}

/// Owner A, in the child process: flush, wait for B's claim, then fail to
/// flush a late write.
async fn owner_a_in_child(fence_spec: &str, dir: &std::path::Path) {
    let node = Objects::new(
        fence_from_spec(fence_spec),
        dir_blobs(dir),
        StorageLimits::default(),
    );
    let mut a = node.open(&counter()).await.expect("A opens");
    put(&mut a, "n", "from A");
    a.flush().await.expect("A flushes");
    std::fs::write(signal(dir, "a-flushed"), b"").expect("signal B");
    wait_for_file(&signal(dir, "b-claimed"), None).await;
    put(&mut a, "only-a", "late");
    assert_eq!(a.flush().await, Err(StorageError::Superseded));
    std::fs::write(signal(dir, "a-superseded"), b"").expect("signal B");
}

/// Runs the parent's or, in the re-executed binary, the child's part.
async fn two_processes(test: &str, fence_spec: impl FnOnce() -> String) {
    match (std::env::var(CHILD_FENCE), std::env::var_os(CHILD_DIR)) {
        (Ok(spec), Some(dir)) => owner_a_in_child(&spec, std::path::Path::new(&dir)).await,
        _ => across_processes(test, &fence_spec()).await,
    }
}

#[tokio::test]
async fn sqlite_fence_across_processes() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("fence.sqlite");
    two_processes("fencing::sqlite_fence_across_processes", || {
        format!("sqlite:{}", path.display())
    })
    .await;
}

#[tokio::test]
async fn etcd_fence_across_processes() {
    if std::env::var_os(CHILD_FENCE).is_some() {
        // The child: the parent's etcd is named in its fence spec.
        two_processes("", String::new).await;
        return;
    }
    let Some(etcd) = Etcd::start() else { return };
    two_processes("fencing::etcd_fence_across_processes", || {
        format!("etcd:{}", etcd.endpoint)
    })
    .await;
}

/// A read-only owner's confirm: `Ok` while nobody claimed or advanced the
/// object since its claim or its last flush, `Superseded` (for ever) once
/// another owner claimed it, before or after that owner's first write.
/// Also the fence's `check` itself: a token that was never handed out, or
/// one of a key never claimed, is no proof of ownership.
async fn a_superseded_reader_is_refused(fence: Arc<dyn Fence>) {
    let blobs: Arc<dyn BlobStore> = Arc::new(MemoryBlobStore::new());
    let node = || {
        Objects::new(
            Arc::clone(&fence),
            Arc::clone(&blobs),
            StorageLimits::default(),
        )
    };
    let mut a = node().open(&counter()).await.expect("A opens");
    a.confirm()
        .await
        .expect("A owns the object after its claim");
    put(&mut a, "n", "1");
    // With a write pending, confirm is the flush.
    a.confirm().await.expect("A's confirm flushes its write");
    assert!(!a.has_unflushed(), "the confirm flushed");
    assert_eq!(text(&mut a, "n").as_deref(), Some("1"));
    a.confirm()
        .await
        .expect("still the owner after its own flush");

    // B claims; before B writes anything, A's read is already refused.
    let mut b = node().open(&counter()).await.expect("B opens");
    assert_eq!(text(&mut a, "n").as_deref(), Some("1"), "A's stale copy");
    assert_eq!(a.confirm().await, Err(StorageError::Superseded));
    assert!(a.is_superseded());
    assert_eq!(a.confirm().await, Err(StorageError::Superseded));
    assert_eq!(a.get(&["n".to_owned()]), Err(StorageError::Superseded));

    // B writes; C claims after B's write; B's read is refused, C reads it.
    put(&mut b, "n", "2");
    b.confirm().await.expect("B flushes");
    b.confirm().await.expect("B reads as the owner");
    let mut c = node().open(&counter()).await.expect("C opens");
    assert_eq!(b.confirm().await, Err(StorageError::Superseded));
    assert!(!c.is_superseded());
    c.confirm().await.expect("C owns it");
    assert_eq!(text(&mut c, "n").as_deref(), Some("2"));

    // The fence's check, directly.
    let key = counter().ring_key();
    assert!(matches!(
        fence.check("do:app/Counter/never-claimed", 1).await,
        Err(ObjectsError::Superseded)
    ));
    let claim = fence.claim(&key).await.expect("a claim");
    fence
        .check(&key, claim.token)
        .await
        .expect("the claim's token");
    assert!(matches!(
        fence.check(&key, claim.token + 1).await,
        Err(ObjectsError::Superseded)
    ));
    let next = fence
        .advance(&key, claim.token, &claim.head)
        .await
        .expect("an advance");
    fence.check(&key, next).await.expect("the advance's token");
    assert!(matches!(
        fence.check(&key, claim.token).await,
        Err(ObjectsError::Superseded)
    ));
}

#[tokio::test]
async fn sqlite_fence_refuses_a_superseded_reader() {
    let stores = Stores::new();
    a_superseded_reader_is_refused(Arc::clone(&stores.fence)).await;
}

#[tokio::test]
async fn etcd_fence_refuses_a_superseded_reader() {
    let Some(etcd) = Etcd::start() else { return };
    a_superseded_reader_is_refused(etcd.fence()).await;
}
