//! What a store holds is believed only if a node wrote it
//! (`hearth_runtime::store::records`), and a Worker's secrets are the
//! script's, not a version's (`hearth_runtime::store::secrets`): a record
//! edited in the store is refused and counted; a deleted secret does not
//! come back through a rollback or a split; two runtimes deploying one
//! script at once never write the same version; old versions are pruned;
//! a store written before records were signed is upgraded.
//!
//! Each test runs real runtimes over a directory store, the `config-echo`
//! sample answering `GET /<NAME>` with the value of its variable `NAME`
//! (`env=<value or -> config=…`).

use std::path::Path;

use http_body_util::BodyExt;

use hearth_runtime::body;
use hearth_runtime::store::versions::VersionError;
use hearth_runtime::{Plan, Runtime, RuntimeConfig};

const SECRET: &str = "s3cr3t-Value-7f1c2b9e";

fn sample(name: &str) -> Vec<u8> {
    hearth_sample_workers::bytes(name).expect("sample Worker built")
}

fn config(dir: &Path) -> RuntimeConfig {
    RuntimeConfig::new(dir)
        .artifact_key([7; 32])
        .instance_pool_size(20)
}

/// `GET http://<id>.localhost/<path>` through `rt`: status and body.
async fn get(rt: &Runtime, id: &str, path: &str) -> (u16, String) {
    let req = http::Request::get(format!("http://{id}.localhost/{path}"))
        .body(body::full(""))
        .expect("request");
    let resp = rt.serve(id, req).await;
    let status = resp.status().as_u16();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// Why the store refuses `app`'s deployment (it must).
async fn refusal(rt: &Runtime) -> String {
    rt.script_store()
        .meta("app")
        .await
        .expect_err("the record is refused")
        .to_string()
}

/// Edits the file at `path` with `edit` (text in, text out).
fn edit(path: &Path, edit: impl FnOnce(String) -> String) {
    let text = std::fs::read_to_string(path).expect("read record");
    let edited = edit(text.clone());
    assert_ne!(edited, text, "the edit changed nothing");
    std::fs::write(path, edited).expect("write record");
}

/// Someone who can write the store but holds no key points `app`'s
/// deployment at another stored blob (one that prints its environment),
/// and adds a binding: each edit is refused on the next load, with a
/// message naming the record, and counted; the secret is never printed.
/// Before records were signed, the first edit answered `env=<secret>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_record_is_refused_and_counted_and_no_secret_leaks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(config(dir.path())).expect("runtime");
    let hello = rt
        .deploy("app", Plan::Free, sample("hello"))
        .await
        .expect("deploy app");
    rt.put_secret("app", "TOKEN", SECRET).await.expect("secret");
    // Another Worker's blob that prints what it is asked for.
    let dumper = rt
        .deploy("dumper", Plan::Free, sample("config-echo"))
        .await
        .expect("deploy dumper");
    assert_eq!(
        get(&rt, "app", "TOKEN").await,
        (200, "hello from app".into())
    );
    let current = dir.path().join("scripts").join("app.json");
    let signed = std::fs::read_to_string(&current).expect("record");

    // 1. The hash pointed at the dumper's blob.
    edit(&current, |t| t.replace(&hello.meta.hash, &dumper.meta.hash));
    rt.evict("app");
    let (status, body) = get(&rt, "app", "TOKEN").await;
    assert_eq!(status, 500, "{body}");
    assert!(!body.contains(SECRET), "the secret leaked: {body}");
    assert!(body.contains("could not be loaded"), "{body}");
    assert_eq!(rt.stats().store_metadata_rejected, 1);
    // The reason (in the node's log, and from the store API): the record
    // and what is wrong with it.
    let e = refusal(&rt).await;
    assert!(
        e.contains("scripts/app.json") && e.contains("MAC does not check"),
        "{e}"
    );
    assert_eq!(rt.stats().store_metadata_rejected, 2);

    // 2. A service binding added to the record as signed.
    std::fs::write(&current, &signed).expect("restore");
    edit(&current, |t| {
        t.replacen(
            "\n  \"script_id\"",
            "\n  \"bindings\": {\"services\": {\"auth\": \"dumper\"}},\n  \"script_id\"",
            1,
        )
    });
    let (status, body) = get(&rt, "app", "").await;
    assert_eq!(status, 500, "{body}");
    assert_eq!(rt.stats().store_metadata_rejected, 3);

    // 3. The MAC taken out: a record without one is refused too.
    let unsigned = signed
        .lines()
        .filter(|l| !l.contains("\"mac\""))
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&current, unsigned).expect("write");
    let (status, body) = get(&rt, "app", "").await;
    assert_eq!(status, 500, "{body}");
    assert!(refusal(&rt).await.contains("carries no MAC"));
    assert_eq!(rt.stats().store_metadata_rejected, 5);

    // A version record edited the same way cannot be rolled back to.
    std::fs::write(&current, &signed).expect("restore");
    assert_eq!(get(&rt, "app", "").await, (200, "hello from app".into()));
    rt.deploy("app", Plan::Free, sample("hello"))
        .await
        .expect("deploy v2");
    let v1 = dir.path().join("versions").join("app").join("1.json");
    edit(&v1, |t| t.replace(&hello.meta.hash, &dumper.meta.hash));
    let e = rt.rollback("app", Some(1)).await.expect_err("refused");
    assert!(
        matches!(
            e,
            VersionError::Store(hearth_runtime::StoreError::Unauthenticated { .. })
        ),
        "{e}"
    );
    assert_eq!(rt.stats().store_metadata_rejected, 6);
    // The node serves its other Workers as before.
    assert_eq!(get(&rt, "dumper", "TOKEN").await.0, 200);
}

/// A secret is the script's: deleted, it stays deleted through a
/// rollback and a split to versions deployed while it existed; rotated,
/// every version serves the new value. Before, version records carried
/// the sealed value and a rollback served the deleted secret again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_secret_stays_deleted_through_a_rollback_and_a_split() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(config(dir.path())).expect("runtime");
    rt.deploy("app", Plan::Free, sample("config-echo"))
        .await
        .expect("v1");
    let changed = rt.put_secret("app", "TOKEN", SECRET).await.expect("put");
    assert_eq!(changed.version, 1, "a secret change is not a version");
    assert_eq!(changed.secrets, ["TOKEN"]);
    let v2 = rt
        .deploy("app", Plan::Free, sample("config-echo"))
        .await
        .expect("v2");
    assert_eq!(v2.meta.version, 2);
    let want = format!("env={SECRET} config={SECRET}");
    assert_eq!(get(&rt, "app", "TOKEN").await, (200, want));
    // Rotated: version 1 (deployed with the old value) serves the new one.
    rt.put_secret("app", "TOKEN", "rotated")
        .await
        .expect("rotate");
    rt.rollback("app", Some(1)).await.expect("rollback to 1");
    assert_eq!(
        get(&rt, "app", "TOKEN").await,
        (200, "env=rotated config=rotated".into())
    );
    rt.set_deployment("app", &["2@100%".parse().expect("share")])
        .await
        .expect("back to 2");

    let (_, deleted) = rt.delete_secret("app", "TOKEN").await.expect("delete");
    assert!(deleted);
    let gone = (200, "env=- config=-".to_string());
    assert_eq!(get(&rt, "app", "TOKEN").await, gone);
    // Back to version 1, deployed while the secret existed.
    rt.rollback("app", None).await.expect("rollback");
    assert_eq!(get(&rt, "app", "TOKEN").await, gone);
    // A split of both versions.
    let split = [
        "1@50%".parse().expect("share"),
        "2@50%".parse().expect("share"),
    ];
    rt.set_deployment("app", &split).await.expect("split");
    for key in 0..20 {
        let req = http::Request::get("http://app.localhost/TOKEN")
            .header("hearth-version-key", format!("client-{key}"))
            .body(body::full(""))
            .expect("request");
        let resp = rt.serve("app", req).await;
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(&bytes[..], b"env=- config=-", "client {key}");
    }
    // And no record in the store holds its sealed value any more.
    for entry in walk(dir.path()) {
        if entry.extension().is_some_and(|e| e == "json") {
            let text = std::fs::read_to_string(&entry).expect("read");
            assert!(!text.contains("TOKEN"), "{}: {text}", entry.display());
        }
    }
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// Two runtimes over one store (two nodes) deploy one script at the same
/// moment, over and over, and put secrets while the other deploys: every
/// deploy gets a version of its own, every version is on record as it
/// was deployed, and no secret put is lost. Before, both read the same
/// latest number and the second write replaced the first's version, and
/// a deploy wrote back the secrets it had read, dropping a put made
/// meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_at_once_never_share_a_version_nor_lose_a_secret() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = Runtime::new(config(dir.path())).expect("runtime a");
    let b = Runtime::new(config(dir.path())).expect("runtime b");
    a.deploy("app", Plan::Free, sample("config-echo"))
        .await
        .expect("first deploy");
    let mut reports = Vec::new();
    const ROUNDS: usize = 6;
    for round in 0..ROUNDS {
        let name = format!("K{round}");
        let (ra, rb, put) = tokio::join!(
            a.deploy("app", Plan::Free, sample("config-echo")),
            b.deploy("app", Plan::Free, sample("config-echo")),
            b.put_secret("app", &name, "v"),
        );
        reports.push(ra.expect("deploy on a").meta);
        reports.push(rb.expect("deploy on b").meta);
        put.expect("secret");
    }
    let mut numbers: Vec<u64> = reports.iter().map(|m| m.version).collect();
    numbers.sort_unstable();
    numbers.dedup();
    assert_eq!(numbers.len(), 2 * ROUNDS, "versions shared: {numbers:?}");
    let list = a.versions("app").await.expect("versions");
    for m in &reports {
        let on_record = list
            .versions
            .iter()
            .find(|v| v.version == m.version)
            .unwrap_or_else(|| panic!("version {} is not on record", m.version));
        assert_eq!(
            on_record.deployed_at_ms, m.deployed_at_ms,
            "version {} was overwritten",
            m.version
        );
    }
    let names = a.secret_names("app").await.expect("names");
    let want: Vec<String> = (0..ROUNDS).map(|r| format!("K{r}")).collect();
    assert_eq!(names, want);
    // No claim is left behind.
    assert_eq!(
        std::fs::read_dir(dir.path().join("claims").join("app"))
            .map(|d| d.count())
            .unwrap_or(0),
        0
    );
}

/// Each deploy keeps the `keep_versions` latest versions on record and
/// deletes the older ones; a rollback can reach only those.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_prunes_versions_beyond_the_ones_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(config(dir.path()).keep_versions(3)).expect("runtime");
    for _ in 0..5 {
        rt.deploy("app", Plan::Free, sample("hello"))
            .await
            .expect("deploy");
    }
    let numbers = |list: &hearth_runtime::store::versions::VersionList| -> Vec<u64> {
        list.versions.iter().map(|m| m.version).collect()
    };
    let list = rt.versions("app").await.expect("versions");
    assert_eq!(numbers(&list), [3, 4, 5]);
    let e = rt.rollback("app", Some(2)).await.expect_err("pruned");
    assert!(
        matches!(e, VersionError::NoSuchVersion { version: 2, .. }),
        "{e}"
    );
    // Serving an older version, the next deploy still keeps three.
    rt.rollback("app", Some(3)).await.expect("rollback");
    rt.deploy("app", Plan::Free, sample("hello"))
        .await
        .expect("deploy");
    let list = rt.versions("app").await.expect("versions");
    assert_eq!(numbers(&list), [4, 5, 6]);
}

/// A store written by a hearth from before records were signed: its
/// records have no MAC and its secrets sit in the deployment and version
/// records. A node refuses it; with `accept_unsigned_records` it serves
/// it, secrets included; the upgrade moves the secrets into their own
/// records and signs everything, after which a node without the setting
/// serves it and no version record holds a sealed value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_from_before_signing_is_served_while_upgrading_then_upgraded() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Make the old layout: deploy and put a secret, then rewrite the
    // records as the earlier hearth wrote them (no MAC, secrets inside).
    let rt = Runtime::new(config(dir.path())).expect("runtime");
    rt.deploy("app", Plan::Free, sample("config-echo"))
        .await
        .expect("deploy");
    rt.put_secret("app", "TOKEN", SECRET).await.expect("secret");
    drop(rt);
    let secret_file = dir.path().join("secrets/app/TOKEN.json");
    let sealed: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&secret_file).expect("secret record")).expect("json");
    let sealed = sealed["sealed"].clone();
    std::fs::remove_file(&secret_file).expect("remove");
    for file in [
        dir.path().join("scripts/app.json"),
        dir.path().join("versions/app/1.json"),
    ] {
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).expect("read")).expect("json");
        let o = v.as_object_mut().expect("object");
        o.remove("mac");
        o.insert("secrets".into(), serde_json::json!({ "TOKEN": sealed }));
        std::fs::write(&file, serde_json::to_vec_pretty(&v).expect("json")).expect("write");
    }

    let strict = Runtime::new(config(dir.path())).expect("runtime");
    let (status, body) = get(&strict, "app", "TOKEN").await;
    assert_eq!(status, 500, "{body}");
    assert!(refusal(&strict).await.contains("carries no MAC"));
    drop(strict);

    let upgrading =
        Runtime::new(config(dir.path()).accept_unsigned_records(true)).expect("runtime");
    let want = (200, format!("env={SECRET} config={SECRET}"));
    assert_eq!(get(&upgrading, "app", "TOKEN").await, want);
    let done = upgrading.script_store().upgrade().await.expect("upgrade");
    assert_eq!(
        (done.scripts, done.records_signed, done.secrets_moved),
        (1, 2, 1)
    );
    // Done once: nothing more to do.
    let again = upgrading.script_store().upgrade().await.expect("upgrade");
    assert_eq!((again.records_signed, again.secrets_moved), (0, 0));
    drop(upgrading);

    let strict = Runtime::new(config(dir.path())).expect("runtime");
    assert_eq!(get(&strict, "app", "TOKEN").await, want);
    assert_eq!(strict.stats().store_metadata_rejected, 0);
    let v1 = std::fs::read_to_string(dir.path().join("versions/app/1.json")).expect("v1");
    assert!(!v1.contains("TOKEN"), "{v1}");
}
