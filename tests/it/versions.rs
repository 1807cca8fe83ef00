//! Versions, rollback and gradual rollout on a real cluster of three nodes
//! sharing one store: every deploy is a numbered version, responses say
//! which one served them, a rollback and a split reach every node at once
//! (announced like a deploy), a split sends a stable key to one version
//! and about its percentage of distinct keys to each, and bad splits are
//! refused with a clear message. One cluster for the whole file (CI time).

use hearth::testing::TestCluster;
use hearth_admin_client::{AdminClient, AdminError, VersionShare};
use hearth_runtime::Plan;
use hearth_runtime::store::meta::Share;
use hearth_runtime::store::versions::{bucket, pick};

fn sample(name: &str) -> Vec<u8> {
    hearth_sample_workers::bytes(name).expect("sample Workers are built")
}

fn share(version: u64, percent: u8) -> VersionShare {
    VersionShare { version, percent }
}

/// The status and body of a refused admin call.
fn refusal(e: AdminError) -> (u16, String) {
    match e {
        AdminError::Refused { status, body, .. } => (status.as_u16(), body),
        e => panic!("expected a refusal, got {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_roll_back_and_split_on_every_node() {
    let c = TestCluster::start(3).await.expect("cluster");
    let admin = |i: usize| {
        AdminClient::new(
            &format!("http://{}", c.node(i).admin_addr),
            Some(c.token().to_string()),
        )
        .expect("admin client")
    };

    // Two deploys: versions 1 and 2; every node serves 2 and says so.
    let v1 = c.deploy("app", Plan::Free, sample("hello")).await;
    assert_eq!(v1.expect("deploy").meta.version, 1);
    let v2 = c.deploy("app", Plan::Free, sample("wstd-hello")).await;
    assert_eq!(v2.expect("deploy").meta.version, 2);
    for i in 0..3 {
        let r = c.get(i, "app", "/").await.expect("request");
        assert_eq!(r.text(), "hello from wstd", "node {i}");
        assert_eq!(r.header("x-hearth-version"), "2", "node {i}");
    }

    // Roll back through node 1 (not the deploying node), under load through
    // every node: no request fails, and version 1 is served on every node
    // as soon as the call returns.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let load = async {
        let (mut sent, mut failed) = (0usize, 0usize);
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let r = c.get(sent % 3, "app", "/").await.expect("request");
            failed += usize::from(r.status != 200);
            sent += 1;
        }
        (sent, failed)
    };
    let roll = async {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let done = admin(1).rollback("app", None).await;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        done
    };
    let ((sent, failed), done) = tokio::join!(load, roll);
    let done = done.expect("rollback");
    assert!(sent > 10, "only {sent} requests during the rollback");
    assert_eq!(
        failed, 0,
        "{failed} of {sent} requests failed during the rollback"
    );
    assert_eq!(done.deployment, vec![share(1, 100)]);
    assert_eq!(
        done.announced.acknowledged, 2,
        "{:?}",
        done.announced.failed
    );
    for i in 0..3 {
        let r = c.get(i, "app", "/").await.expect("request");
        assert_eq!(r.text(), "hello from app", "node {i}");
        assert_eq!(r.header("x-hearth-version"), "1", "node {i}");
    }
    let list = admin(2).versions("app").await.expect("versions");
    let numbers: Vec<u64> = list.versions.iter().map(|v| v.version).collect();
    assert_eq!(numbers, vec![1, 2]);
    assert_eq!(list.deployment, vec![share(1, 100)]);
    // Nothing before version 1.
    let (status, body) = refusal(admin(0).rollback("app", None).await.expect_err("no v0"));
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("no earlier version"), "{body}");

    // Bad splits are refused, and change nothing.
    for (split, status, says) in [
        (vec![share(2, 10), share(1, 80)], 400, "sum to 90%"),
        (vec![share(2, 50), share(2, 50)], 400, "named twice"),
        (vec![share(9, 10), share(1, 90)], 422, "no version 9"),
    ] {
        let e = admin(0)
            .set_deployment("app", &split)
            .await
            .expect_err("bad split");
        let (got, body) = refusal(e);
        assert_eq!(got, status, "{split:?}: {body}");
        assert!(body.contains(says), "{split:?}: {body}");
    }
    let e = admin(0)
        .set_deployment("nope", &[share(1, 100)])
        .await
        .expect_err("unknown script");
    assert_eq!(refusal(e).0, 404);

    // A split of 10% version 2, 90% version 1, set through node 2.
    let done = admin(2)
        .set_deployment("app", &[share(2, 10), share(1, 90)])
        .await
        .expect("split");
    assert_eq!(done.deployment, vec![share(2, 10), share(1, 90)]);
    // One key sticks to one version, on every node.
    let mut first = None;
    for i in 0..6 {
        let r = c
            .send(
                i % 3,
                "app",
                http::Method::GET,
                "/",
                Default::default(),
                &[("hearth-version-key", "client-a")],
            )
            .await
            .expect("request");
        let v = r.header("x-hearth-version").to_string();
        let text = r.text();
        assert_eq!(
            text,
            if v == "2" {
                "hello from wstd"
            } else {
                "hello from app"
            }
        );
        assert_eq!(first.get_or_insert(v.clone()), &v, "node {}", i % 3);
    }
    let split = [
        Share {
            version: 2,
            percent: 10,
        },
        Share {
            version: 1,
            percent: 90,
        },
    ];
    // 2,000 distinct keys: about 10% land on version 2 (hashing, so a
    // wide tolerance: ±3 points).
    let n = 2000;
    let mut twos = 0;
    for k in 0..n {
        let key = format!("user-{k}");
        let r = c
            .send(
                k % 3,
                "app",
                http::Method::GET,
                "/",
                Default::default(),
                &[("hearth-version-key", key.as_str())],
            )
            .await
            .expect("request");
        assert_eq!(r.status, 200);
        // Exactly the version the key hashes to (a dropped key header
        // would make it random).
        let expect = pick(&split, bucket("app", key.as_bytes())).expect("version");
        assert_eq!(r.header("x-hearth-version"), expect.to_string(), "{key}");
        twos += usize::from(expect == 2);
    }
    assert!(
        (140..=260).contains(&twos),
        "{twos} of {n} keys on version 2, expected about 200"
    );
    // Each node counted its share per version, shown by the admin API and
    // in /metrics.
    let counted: u64 = {
        let mut sum = 0;
        for i in 0..3 {
            let list = admin(i).versions("app").await.expect("versions");
            sum += list.counts.iter().map(|c| c.requests).sum::<u64>();
        }
        sum
    };
    assert!(counted >= n as u64, "{counted} counted of {n}");
    let home = c.home_of("app").expect("home");
    let metrics = admin(home).metrics().await.expect("metrics");
    assert!(
        metrics
            .sample("hearth_version_requests_total", "version=\"2\"")
            .is_some_and(|v| v > 0.0),
        "{}",
        metrics.0
    );

    // A secret belongs to the script, not to a version: it can change
    // during a split, and every version of the split serves it.
    admin(0)
        .put_secret("app", "TOKEN", "s3cret")
        .await
        .expect("a secret during a split");

    // Back to one version: version 2 at 100% everywhere; a new deploy is
    // version 3 (numbers are never reused after a rollback).
    admin(0)
        .set_deployment("app", &[share(2, 100)])
        .await
        .expect("end the split");
    for i in 0..3 {
        let r = c.get(i, "app", "/").await.expect("request");
        assert_eq!(r.header("x-hearth-version"), "2", "node {i}");
    }
    let v3 = c.deploy("app", Plan::Free, sample("hello")).await;
    assert_eq!(v3.expect("deploy").meta.version, 3);
    // A secret change is no version (a rollback keeps today's secrets),
    // and no version record carries secrets.
    admin(0)
        .put_secret("app", "TOKEN", "rotated")
        .await
        .expect("secret");
    let list = admin(0).versions("app").await.expect("versions");
    assert_eq!(list.deployment, vec![share(3, 100)]);
    assert!(list.versions.iter().all(|v| v.secrets.is_empty()));
}
