//! One object's storage: list semantics, limits, transactions, restore
//! and compaction.

use std::collections::BTreeMap;

use hearth_objects::{COMPACT_AFTER_SEGMENTS, ListOptions, StorageError, StorageLimits};

use crate::support::{Stores, counter, put, text};

fn keys(pairs: Vec<(String, Vec<u8>)>) -> Vec<String> {
    pairs.into_iter().map(|(key, _)| key).collect()
}

#[tokio::test]
async fn list_follows_cloudflares_semantics() {
    let stores = Stores::new();
    let mut storage = stores.open().await;
    let all = ["", "a", "a/1", "a/2", "b", "ba", "c", "zz", "é"];
    // Stored out of order: the order is the storage's.
    for key in all.iter().rev() {
        put(&mut storage, key, &format!("v{key}"));
    }
    let list = |storage: &mut hearth_objects::ObjectStorage, options: ListOptions| {
        keys(storage.list(&options).expect("list"))
    };
    // UTF-8 (bytewise) order; values come with their keys.
    assert_eq!(list(&mut storage, ListOptions::default()), all);
    let pairs = storage.list(&ListOptions::default()).expect("list");
    assert!(pairs.iter().all(|(k, v)| v == format!("v{k}").as_bytes()));

    let prefix = |p: &str| ListOptions {
        prefix: Some(p.to_owned()),
        ..ListOptions::default()
    };
    assert_eq!(list(&mut storage, prefix("a/")), ["a/1", "a/2"]);
    assert_eq!(list(&mut storage, prefix("b")), ["b", "ba"]);
    assert_eq!(list(&mut storage, prefix("")), all);
    assert!(list(&mut storage, prefix("nothing")).is_empty());

    // start is inclusive, start_after and end exclusive.
    let range = |start: Option<&str>, after: Option<&str>, end: Option<&str>| ListOptions {
        start: start.map(str::to_owned),
        start_after: after.map(str::to_owned),
        end: end.map(str::to_owned),
        ..ListOptions::default()
    };
    assert_eq!(
        list(&mut storage, range(Some("b"), None, None)),
        ["b", "ba", "c", "zz", "é"]
    );
    assert_eq!(
        list(&mut storage, range(None, Some("b"), None)),
        ["ba", "c", "zz", "é"]
    );
    assert_eq!(
        list(&mut storage, range(None, None, Some("a/1"))),
        ["", "a"]
    );
    assert_eq!(
        list(&mut storage, range(Some("a/1"), None, Some("ba"))),
        ["a/1", "a/2", "b"]
    );
    assert!(list(&mut storage, range(Some("c"), None, Some("c"))).is_empty());

    // reverse: descending, and limit takes the range's last keys.
    let reverse = ListOptions {
        reverse: true,
        limit: Some(2),
        ..ListOptions::default()
    };
    assert_eq!(list(&mut storage, reverse), ["é", "zz"]);
    let reverse_prefix = ListOptions {
        prefix: Some("a".to_owned()),
        reverse: true,
        limit: Some(2),
        ..ListOptions::default()
    };
    assert_eq!(list(&mut storage, reverse_prefix), ["a/2", "a/1"]);
    let reverse_range = ListOptions {
        start: Some("a".to_owned()),
        end: Some("c".to_owned()),
        reverse: true,
        ..ListOptions::default()
    };
    assert_eq!(
        list(&mut storage, reverse_range),
        ["ba", "b", "a/2", "a/1", "a"]
    );
    let limited = ListOptions {
        start_after: Some("a".to_owned()),
        limit: Some(3),
        ..ListOptions::default()
    };
    assert_eq!(list(&mut storage, limited), ["a/1", "a/2", "b"]);
    // prefix and range together: their intersection.
    let both = ListOptions {
        prefix: Some("a".to_owned()),
        start_after: Some("a/1".to_owned()),
        ..ListOptions::default()
    };
    assert_eq!(list(&mut storage, both), ["a/2"]);

    // Malformed options are refused, not guessed at.
    let start_and_after = range(Some("a"), Some("b"), None);
    assert!(matches!(
        storage.list(&start_and_after),
        Err(StorageError::Invalid(_))
    ));
    let zero = ListOptions {
        limit: Some(0),
        ..ListOptions::default()
    };
    assert!(matches!(storage.list(&zero), Err(StorageError::Invalid(_))));
}

#[tokio::test]
async fn get_put_delete_work_in_batches() {
    let stores = Stores::new();
    let mut storage = stores.open().await;
    storage
        .put(vec![
            ("a".to_owned(), b"1".to_vec()),
            ("b".to_owned(), b"2".to_vec()),
            ("a".to_owned(), b"3".to_vec()),
            ("empty".to_owned(), Vec::new()),
        ])
        .expect("put");
    let got = storage
        .get(&[
            "a".to_owned(),
            "missing".to_owned(),
            "b".to_owned(),
            "empty".to_owned(),
        ])
        .expect("get");
    assert_eq!(
        got,
        [
            Some(b"3".to_vec()),
            None,
            Some(b"2".to_vec()),
            Some(Vec::new())
        ]
    );
    assert_eq!(storage.bytes(), 2 + 2 + 5);
    let deleted = storage
        .delete(&[
            "a".to_owned(),
            "missing".to_owned(),
            "empty".to_owned(),
            "a".to_owned(),
        ])
        .expect("delete");
    assert_eq!(deleted, 2, "a and empty held values; missing did not");
    assert_eq!(storage.bytes(), 2);
    storage.delete_all().expect("delete_all");
    assert!(
        storage
            .list(&ListOptions::default())
            .expect("list")
            .is_empty()
    );
    assert_eq!(storage.bytes(), 0);
}

fn limit_error(result: Result<impl std::fmt::Debug, StorageError>, limit: &str) {
    match result {
        Err(StorageError::Limit(message)) => {
            assert!(message.contains(limit), "{message:?} does not name {limit}")
        }
        other => panic!("expected a {limit} error, got {other:?}"),
    }
}

#[tokio::test]
async fn limits_are_enforced_and_named() {
    let stores = Stores::new();
    let mut storage = stores.open().await;
    let defaults = StorageLimits::default();
    assert_eq!(defaults.max_key_bytes, 2048);
    assert_eq!(defaults.max_value_bytes, 128 * 1024);
    assert_eq!(defaults.max_batch_keys, 128);
    assert_eq!(defaults.max_object_bytes, 64 << 20);

    // At the limits: accepted.
    let key = "k".repeat(2048);
    storage
        .put(vec![(key.clone(), vec![7; 128 * 1024])])
        .expect("a 2 KiB key and a 128 KiB value fit");
    assert_eq!(
        storage.get(std::slice::from_ref(&key)).expect("get")[0]
            .as_ref()
            .map(Vec::len),
        Some(128 * 1024)
    );
    // One past: refused, naming the limit.
    let long = "k".repeat(2049);
    limit_error(storage.put(vec![(long.clone(), vec![1])]), "max_key_bytes");
    limit_error(storage.get(std::slice::from_ref(&long)), "max_key_bytes");
    limit_error(storage.delete(std::slice::from_ref(&long)), "max_key_bytes");
    limit_error(
        storage.put(vec![("v".to_owned(), vec![0; 128 * 1024 + 1])]),
        "max_value_bytes",
    );
    let many: Vec<String> = (0..129).map(|i| format!("key{i}")).collect();
    limit_error(storage.get(&many), "max_batch_keys");
    limit_error(storage.delete(&many), "max_batch_keys");
    limit_error(
        storage.put(many.iter().map(|k| (k.clone(), vec![1])).collect()),
        "max_batch_keys",
    );
    storage
        .get(&many[..128])
        .expect("128 keys in one batch are allowed");

    // The per-object total: a small one to reach.
    let stores = Stores::new();
    let limits = StorageLimits {
        max_object_bytes: 100,
        ..StorageLimits::default()
    };
    let mut storage = stores
        .objects_with(limits)
        .open(&counter())
        .await
        .expect("open");
    storage
        .put(vec![("a".to_owned(), vec![0; 59])])
        .expect("60 bytes fit"); // 1 + 59
    // Overwriting counts the new size, not both.
    storage
        .put(vec![("a".to_owned(), vec![0; 69])])
        .expect("70 bytes fit");
    assert_eq!(storage.bytes(), 70);
    // A batch past the total is refused whole: its first pair is not kept.
    limit_error(
        storage.put(vec![
            ("b".to_owned(), vec![0; 9]),
            ("c".to_owned(), vec![0; 30]),
        ]),
        "max_object_bytes",
    );
    assert_eq!(storage.get(&["b".to_owned()]).expect("get"), [None]);
    assert_eq!(storage.bytes(), 70);
    storage
        .put(vec![("b".to_owned(), vec![0; 29])])
        .expect("exactly 100 bytes fit");
    limit_error(
        storage.put(vec![("x".to_owned(), Vec::new())]),
        "max_object_bytes",
    );
    // Deleting frees room.
    storage.delete(&["a".to_owned()]).expect("delete");
    storage
        .put(vec![("x".to_owned(), vec![0; 50])])
        .expect("room again");
    assert_eq!(storage.bytes(), 30 + 51);
    // Nothing refused was recorded: a restore has exactly what was kept.
    storage.flush().await.expect("flush");
    drop(storage);
    let mut restored = stores
        .objects_with(StorageLimits::default())
        .open(&counter())
        .await
        .expect("restore");
    let keys: Vec<String> = restored
        .list(&ListOptions::default())
        .expect("list")
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(keys, ["b", "x"]);
    assert_eq!(restored.bytes(), 81);
}

#[tokio::test]
async fn transactions_commit_or_roll_back_whole() {
    let stores = Stores::new();
    let mut storage = stores.open().await;
    put(&mut storage, "a", "1");
    storage.transaction_begin().expect("begin");
    assert!(
        matches!(storage.transaction_begin(), Err(StorageError::Invalid(_))),
        "no nesting"
    );
    put(&mut storage, "a", "2");
    put(&mut storage, "b", "2");
    storage.delete(&["a".to_owned()]).expect("delete");
    assert_eq!(
        text(&mut storage, "a"),
        None,
        "writes are visible inside the transaction"
    );
    storage.delete_all().expect("delete_all");
    put(&mut storage, "c", "3");
    storage.transaction_rollback().expect("rollback");
    assert_eq!(text(&mut storage, "a").as_deref(), Some("1"));
    assert_eq!(text(&mut storage, "b"), None);
    assert_eq!(text(&mut storage, "c"), None);
    assert_eq!(storage.bytes(), 2);
    assert!(matches!(
        storage.transaction_commit(),
        Err(StorageError::Invalid(_))
    ));
    assert!(matches!(
        storage.transaction_rollback(),
        Err(StorageError::Invalid(_))
    ));

    // A committed transaction is flushed; an open one is not.
    storage.transaction_begin().expect("begin");
    put(&mut storage, "d", "4");
    storage.transaction_commit().expect("commit");
    storage.transaction_begin().expect("begin");
    put(&mut storage, "e", "uncommitted");
    storage
        .flush()
        .await
        .expect("flush with a transaction open");
    assert!(
        !storage.has_unflushed(),
        "the open transaction's write is not pending yet"
    );
    drop(storage);
    let mut restored = stores.open().await;
    assert_eq!(text(&mut restored, "a").as_deref(), Some("1"));
    assert_eq!(text(&mut restored, "d").as_deref(), Some("4"));
    assert_eq!(text(&mut restored, "e"), None);
}

#[tokio::test]
async fn a_restore_sees_exactly_the_flushed_writes() {
    let stores = Stores::new();
    let mut storage = stores.open().await;
    let first_epoch = storage.epoch();
    assert!(!storage.has_unflushed());
    put(&mut storage, "kept", "1");
    put(&mut storage, "deleted", "x");
    storage.delete(&["deleted".to_owned()]).expect("delete");
    assert!(storage.has_unflushed());
    storage.flush().await.expect("flush");
    assert!(!storage.has_unflushed());
    storage.flush().await.expect("an empty flush is a no-op");
    put(&mut storage, "unflushed", "lost");
    put(&mut storage, "kept", "changed but not flushed");
    drop(storage);

    // A new node over the same fence and blobs (as after kill -9).
    let mut restored = stores.open().await;
    assert!(restored.epoch() > first_epoch);
    assert_eq!(text(&mut restored, "kept").as_deref(), Some("1"));
    assert_eq!(text(&mut restored, "deleted"), None);
    assert_eq!(text(&mut restored, "unflushed"), None);
    assert_eq!(restored.bytes(), 5);

    // delete_all survives a restore too, with what followed it.
    put(&mut restored, "before", "x");
    restored.delete_all().expect("delete_all");
    put(&mut restored, "after", "y");
    restored.flush().await.expect("flush");
    drop(restored);
    let mut again = stores.open().await;
    let pairs = again.list(&ListOptions::default()).expect("list");
    assert_eq!(pairs, [("after".to_owned(), b"y".to_vec())]);
}

#[tokio::test]
async fn compaction_keeps_the_state_and_bounds_the_segments() {
    let stores = Stores::new();
    let mut storage = stores.open().await;
    let mut model = BTreeMap::new();
    for i in 0..100u32 {
        let key = format!("k{:02}", i % 37);
        let value = format!("{i}").into_bytes();
        storage
            .put(vec![(key.clone(), value.clone())])
            .expect("put");
        model.insert(key, value);
        if i % 5 == 0 {
            let gone = format!("k{:02}", (i * 7) % 37);
            storage.delete(std::slice::from_ref(&gone)).expect("delete");
            model.remove(&gone);
        }
        storage.flush().await.expect("flush");
        assert!(storage.head().segments.len() <= COMPACT_AFTER_SEGMENTS);
    }
    assert!(
        storage.head().snapshot.is_some(),
        "100 flushes wrote a snapshot"
    );
    drop(storage);
    let mut restored = stores.open().await;
    let listed: BTreeMap<String, Vec<u8>> = restored
        .list(&ListOptions::default())
        .expect("list")
        .into_iter()
        .collect();
    assert_eq!(listed, model);

    // Segments that outweigh the snapshot (1 MiB at least) compact too.
    let before = restored.head().snapshot.clone();
    for i in 0..12u8 {
        restored
            .put(vec![(format!("big{i}"), vec![i; 120 * 1024])])
            .expect("put");
        restored.flush().await.expect("flush");
    }
    assert_ne!(
        restored.head().snapshot,
        before,
        "heavy segments were compacted"
    );
    assert!(restored.head().segments.len() < 12);
    let expected = restored.list(&ListOptions::default()).expect("list");
    let bytes = restored.bytes();
    drop(restored);
    let mut again = stores.open().await;
    assert_eq!(again.list(&ListOptions::default()).expect("list"), expected);
    assert_eq!(again.bytes(), bytes);
}

#[tokio::test]
async fn a_head_naming_a_missing_or_altered_blob_is_an_error() {
    use std::sync::Arc;

    use hearth_objects::{BlobStore, MemoryBlobStore, Objects, ObjectsError};

    let stores = Stores::new();
    let mut storage = stores.open().await;
    put(&mut storage, "n", "1");
    storage.flush().await.expect("flush");
    let segment = storage.head().segments[0].hash.clone();
    drop(storage);

    // The fence's head, blobs from a store that lacks them.
    let empty: Arc<dyn BlobStore> = Arc::new(MemoryBlobStore::new());
    let node = Objects::new(
        Arc::clone(&stores.fence),
        Arc::clone(&empty),
        StorageLimits::default(),
    );
    match node.open(&counter()).await {
        Err(ObjectsError::MissingBlob(hash)) => assert_eq!(hash, segment),
        other => panic!("expected MissingBlob, got {other:?}"),
    }
    // The same name holding other bytes.
    empty.put(&segment, b"not the segment").await.expect("put");
    assert!(matches!(
        node.open(&counter()).await,
        Err(ObjectsError::Corrupt(_))
    ));
}
