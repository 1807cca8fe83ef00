//! Durable Object alarms (issue 43), Cloudflare's API in hearth's JS
//! engine: `ctx.storage.setAlarm/getAlarm/deleteAlarm` and the class's
//! `alarm(alarmInfo)` handler, fired by the runtime's alarm scheduler
//! (`hearth_runtime::objects` alarms) through the object's input gate.
//!
//! [`alarms_fire_retry_and_clear`]: the Worker of
//! `tests/it/object_alarms/alarms.js` on a runtime without a node (every
//! object's home): an alarm fires once, not before its time, with the
//! handler's writes kept and the alarm cleared after; a deleted alarm never
//! fires; a handler that throws is retried with `retryCount` counting; a
//! handler that sets a new alarm gets it fired too; a transaction's alarm
//! change rolls back; a client's forged alarm header never reaches the
//! object as an alarm.
//!
//! [`an_alarm_left_by_a_killed_home_fires_on_its_new_home`]: two `hearth
//! serve` processes; the home of an object with a pending alarm is killed
//! (SIGKILL) and the survivor, its new home, fires the alarm.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use serde_json::{Value, json};

use hearth::sharding::ring::{Member, Ring, RingConfig};
use hearth::testing::{NodeProcess, Signal};
use hearth_runtime::{Lifecycle, Manifest, Runtime, RuntimeConfig, body};

/// `path` (with its `?o=` object) asked of the Worker: status and JSON.
async fn ask(rt: &Runtime, path: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut req = http::Request::builder().uri(format!("http://alarms.localhost{path}"));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp = tokio::time::timeout(
        Duration::from_secs(30),
        rt.serve("alarms", req.body(body::empty()).expect("request")),
    )
    .await
    .unwrap_or_else(|_| panic!("{path}: no answer in 30 s"));
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, value)
}

/// What the object `o`'s alarm handler saw so far.
async fn fired(rt: &Runtime, o: &str) -> Vec<Value> {
    let (status, answer) = ask(rt, &format!("/fired?o={o}"), &[]).await;
    assert_eq!(status, 200, "{answer}");
    answer["fired"].as_array().cloned().unwrap_or_default()
}

/// Waits (up to `within`) until object `o`'s handler ran `runs` times.
async fn wait_fired(rt: &Runtime, o: &str, runs: usize, within: Duration) -> Vec<Value> {
    let until = Instant::now() + within;
    loop {
        let seen = fired(rt, o).await;
        if seen.len() >= runs || Instant::now() > until {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn info(retry_count: u32) -> Value {
    json!({ "retryCount": retry_count, "isRetry": retry_count > 0 })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alarms_fire_retry_and_clear() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(RuntimeConfig::new(dir.path()).artifact_key([7; 32])).expect("runtime");
    let component = hearth::testing::build_js(include_str!("object_alarms/alarms.js"))
        .unwrap_or_else(|e| panic!("alarms.js: {e}"));
    let manifest = Manifest {
        lifecycle: Lifecycle::Auto,
        ..Manifest::from_toml("[durable_objects]\nALARMS = \"Alarmed\"\n").expect("manifest")
    };
    rt.deploy("alarms", manifest, component)
        .await
        .expect("deploy");

    // Set: visible at once, through a Date, and undone by a rollback.
    let set_at = Instant::now();
    assert_eq!(
        ask(&rt, "/set?o=a&in=400", &[]).await,
        (200, json!({ "same": true }))
    );
    // Deleted before its time: never fires.
    assert_eq!(ask(&rt, "/set?o=d&in=300", &[]).await.0, 200);
    assert_eq!(
        ask(&rt, "/delete?o=d", &[]).await,
        (200, json!({ "alarm": null }))
    );
    // Fails its first try, then succeeds on the retry (2 s later).
    assert_eq!(ask(&rt, "/set?o=f&in=0&fail=1", &[]).await.0, 200);
    // Sets a new alarm from its handler once: fires twice.
    assert_eq!(ask(&rt, "/set?o=r&in=0&rearm=1", &[]).await.0, 200);

    let (_, pending) = ask(&rt, "/get?o=a", &[]).await;
    assert!(pending["alarm"].as_f64().is_some(), "{pending}");
    assert_eq!(
        ask(&rt, "/rollback?o=a", &[]).await,
        (200, json!({ "kept": true }))
    );
    assert_eq!(
        ask(&rt, "/bad?o=a", &[]).await,
        (200, json!({ "refused": "TypeError" }))
    );
    // A client cannot make a request the object's alarm: the header is the
    // host's, stripped from the nested call to the object.
    assert_eq!(
        ask(&rt, "/get?o=a", &[("hearth-object-alarm", "0")]).await,
        (200, pending.clone())
    );
    assert!(fired(&rt, "a").await.is_empty(), "fired before its time");

    let seen = wait_fired(&rt, "a", 1, Duration::from_secs(10)).await;
    let late = set_at.elapsed();
    assert_eq!(seen, vec![info(0)], "the alarm fired once");
    assert!(late >= Duration::from_millis(400), "fired after {late:?}");
    assert_eq!(
        ask(&rt, "/get?o=a", &[]).await,
        (200, json!({ "alarm": null }))
    );

    let seen = wait_fired(&rt, "r", 2, Duration::from_secs(10)).await;
    assert_eq!(
        seen,
        vec![info(0), info(0)],
        "a new alarm set by the handler fired"
    );
    let seen = wait_fired(&rt, "f", 2, Duration::from_secs(15)).await;
    assert_eq!(
        seen,
        vec![info(0), info(1)],
        "a throwing handler is retried"
    );
    assert_eq!(
        ask(&rt, "/get?o=f", &[]).await,
        (200, json!({ "alarm": null }))
    );
    assert_eq!(
        ask(&rt, "/get?o=r", &[]).await,
        (200, json!({ "alarm": null }))
    );

    // Nothing fires again, and the deleted alarm never did.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(fired(&rt, "a").await.len(), 1, "fired again");
    assert_eq!(fired(&rt, "r").await.len(), 2, "fired again");
    assert!(fired(&rt, "d").await.is_empty(), "a deleted alarm fired");
    let stats = rt.stats();
    assert!(stats.object_alarms_fired >= 4, "{stats:?}");
    assert_eq!(stats.object_alarms_failed, 1, "{stats:?}");
}

/// The object whose alarm the failover test leaves pending: one homed at
/// `home` on a ring of `members` (ID, RPC port).
fn object_homed_at(members: &[(String, u16)], home: &str) -> String {
    let ring = Ring::new(
        members
            .iter()
            .map(|(id, port)| Member::new(id.clone(), SocketAddr::from(([127, 0, 0, 1], *port)))),
        RingConfig::default(),
    )
    .expect("ring");
    let namespace = hearth_objects::Namespace::new("alarms", "Alarmed");
    (0..1000)
        .map(|i| format!("k{i}"))
        .find(|name| {
            let key = hearth_objects::ObjectKey {
                namespace: namespace.clone(),
                id: namespace.id_from_name(name),
            };
            ring.home(&key.ring_key())
                .is_some_and(|n| n.id.as_str() == home)
        })
        .expect("an object homed there")
}

/// Two `hearth serve` processes sharing a store (and so the embedded
/// fence): an object homed at node-2 sets an alarm 3 s ahead, node-2 is
/// killed (SIGKILL) before it fires, and node-1, the object's new home,
/// fires it, once, with the state the object had.
#[test]
fn an_alarm_left_by_a_killed_home_fires_on_its_new_home() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    crate::hearth()
        .pki(&d.join("pki"), &["node-1", "node-2"])
        .unwrap_or_else(|e| panic!("{e}"));
    let wasm = d.join("alarms.wasm");
    std::fs::write(
        &wasm,
        hearth::testing::build_js(include_str!("object_alarms/alarms.js"))
            .unwrap_or_else(|e| panic!("alarms.js: {e}")),
    )
    .expect("write the Worker");
    crate::hearth()
        .deploy(
            &d.join("store"),
            "alarms",
            &wasm,
            &["--durable-object", "ALARMS=Alarmed"],
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let ports: Vec<(u16, u16)> = (0..2)
        .map(|_| (crate::free_port(), crate::serve::free_udp_port()))
        .collect();
    let members: Vec<(String, u16)> = (0..2)
        .map(|i| (format!("node-{}", i + 1), ports[i].0))
        .collect();
    let name = object_homed_at(&members, "node-2");
    let gossip: Vec<u16> = ports.iter().map(|p| p.1).collect();
    let cfg = crate::serve::shared_config(d, &gossip);
    let mut nodes = crate::serve::spawn_nodes(d, &cfg, &ports);
    let logs = || crate::serve::node_logs(d, 2);
    for node in &nodes {
        node.wait_ready(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{e}; {}", logs()));
    }
    let ask = |node: &NodeProcess, path: String| -> Option<Value> {
        let r = node.get("alarms.localhost", &path).ok()?;
        (r.status == 200).then(|| serde_json::from_str(&r.text()).ok())?
    };
    // Through node-1's front door, served at node-2, the object's home.
    let set = ask(&nodes[0], format!("/set?o={name}&in=3000"))
        .unwrap_or_else(|| panic!("the alarm was not set; {}", logs()));
    assert_eq!(set, json!({ "same": true }));
    nodes[1].signal(Signal::Kill).expect("SIGKILL node-2");
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(45);
    let fired = loop {
        // Until node-1's ring drops node-2, calls for the object wait and
        // fail (its home is unreachable); then node-1 is its home.
        if let Some(answer) = ask(&nodes[0], format!("/fired?o={name}"))
            && answer["fired"].as_array().is_some_and(|f| !f.is_empty())
        {
            break answer["fired"].clone();
        }
        assert!(
            Instant::now() < deadline,
            "the alarm never fired on the new home; {}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!(
        "object alarms failover: fired on the new home {:?} after the kill",
        killed.elapsed()
    );
    assert_eq!(fired, json!([info(0)]), "fired once, on the new home");
    assert_eq!(
        ask(&nodes[0], format!("/get?o={name}")),
        Some(json!({ "alarm": null }))
    );
    nodes[0]
        .stop(Signal::Term, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("node-1 did not stop: {e}"));
}

/// The Rust SDK's alarms: the `counter` sample's object sets an alarm
/// (`storage::set_alarm`) and counts one increment when hearth calls it as
/// its alarm (`alarm_info`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_object_sets_and_gets_its_alarm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(RuntimeConfig::new(dir.path()).artifact_key([7; 32])).expect("runtime");
    let manifest = Manifest {
        lifecycle: Lifecycle::Auto,
        ..Manifest::from_toml("[durable_objects]\nCOUNTER = \"Counter\"\n").expect("manifest")
    };
    rt.deploy(
        "counter",
        manifest,
        hearth_sample_workers::bytes("counter").expect("sample built"),
    )
    .await
    .expect("deploy");
    let text = |path: &'static str| {
        let rt = rt.clone();
        async move {
            let req = http::Request::get(format!("http://counter.localhost{path}"))
                .body(body::empty())
                .expect("request");
            let resp = rt.serve("counter", req).await;
            let status = resp.status().as_u16();
            let bytes = resp.into_body().collect().await.expect("body").to_bytes();
            (status, String::from_utf8_lossy(&bytes).into_owned())
        }
    };
    let (status, at) = text("/c/alarm?in=300").await;
    assert_eq!(status, 200, "{at}");
    assert_eq!(text("/c/alarm").await, (200, at));
    assert_eq!(text("/c/get").await, (200, "0".to_owned()));
    let until = Instant::now() + Duration::from_secs(10);
    while text("/c/get").await.1 == "0" && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        text("/c/get").await,
        (200, "1".to_owned()),
        "the alarm counted"
    );
    assert_eq!(text("/c/alarm").await, (200, "none".to_owned()));
}
