//! Sharded requests between real nodes over mTLS on 127.0.0.1: served by the
//! home, refused by it, home down, home dying, context and traces.

mod rpc_support;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hearth_sharding::context_stack::{
    ContextFrame, ContextStack, LimitOverrides, OutboundWorkerConfig, TailWorkerConfig,
    TraceReporter, TrustLevel,
};
use hearth_sharding::inline::MAX_INLINE_BODY_BYTES;
use hearth_sharding::routing::Route;
use hearth_sharding::rpc::{ForwardOutcome, MAX_SPECULATIVE_BODY_BYTES};
use hearth_sharding::transport::MessageCounts;
use rpc_support::*;

const TEN_MB: usize = 10 * 1024 * 1024;
/// Cap'n Proto framing and the other messages of one forward (bootstrap,
/// dispatch, fetch head, returns, finishes) on top of the body bytes.
const FRAMING_ALLOWANCE: u64 = 32 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_request_is_served_by_the_home_streaming_10mb_both_ways() {
    let (_pki, a, b) = two_nodes(|c| c.threads = 2, |c| c.threads = 2).await;

    let data = pattern(TEN_MB);
    let forwarded = forward(&a, &b.home, "echo", streaming_body(data.clone(), 16 * 1024)).await;
    assert_eq!(forwarded.outcome, ForwardOutcome::Sharded);
    assert_eq!(forwarded.route(), Route::Sharded);
    assert_eq!(forwarded.response.status(), 200);
    assert_eq!(served_by(&forwarded.response), "b");
    assert_eq!(
        served_as(&forwarded.response),
        "sharded",
        "the home serves it as sharded"
    );
    let echoed = guard("response body", collect(forwarded.response.into_body()))
        .await
        .unwrap();
    assert!(
        echoed[..] == data[..],
        "echoed body differs from what was sent"
    );

    assert_eq!(b.workers.served.load(Ordering::SeqCst), 1);
    assert_eq!(a.workers.served.load(Ordering::SeqCst), 0);
    let sa = a.rpc.stats();
    assert_eq!((sa.forwarded, sa.sharded, sa.refusals_received), (1, 1, 0));
    // The counter sees the whole body go out and come back.
    assert!(sa.client_bytes_sent >= TEN_MB as u64);
    assert!(sa.client_bytes_received >= TEN_MB as u64);
    let sb = b.rpc.stats();
    assert_eq!(sb.home.admitted, 1);
    assert_eq!(sb.refusals_sent(), 0);
    eventually("the home's in-flight count returns to zero", || {
        b.rpc.home_in_flight("echo") == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_home_refuses_and_the_request_is_served_locally_with_a_bounded_trombone() {
    let (_pki, a, b) = two_nodes(as_is, as_is).await;
    // No memory for the Worker on its home without evicting busier ones.
    b.workers.can_host.store(false, Ordering::SeqCst);

    let data = pattern(TEN_MB);
    let forwarded = forward(&a, &b.home, "echo", streaming_body(data.clone(), 16 * 1024)).await;
    assert_eq!(forwarded.outcome, ForwardOutcome::Refused);
    assert_eq!(forwarded.route(), Route::Fallback);
    assert_eq!(
        forwarded.response.status(),
        200,
        "a refusal is not an error"
    );
    assert_eq!(served_by(&forwarded.response), "a");
    assert_eq!(
        served_as(&forwarded.response),
        "fallback",
        "a refused request is a fallback"
    );
    let echoed = guard("response body", collect(forwarded.response.into_body()))
        .await
        .unwrap();
    assert!(
        echoed[..] == data[..],
        "locally served body differs from what was sent"
    );
    assert_eq!(a.workers.served.load(Ordering::SeqCst), 1);
    assert_eq!(b.workers.served.load(Ordering::SeqCst), 0);

    // Every byte on the connection to the home, each way, once the
    // reflected calls have drained: a 10 MB body costs no more than the
    // speculative budget plus framing.
    let (sent, received) = settled(|| {
        let s = a.rpc.stats();
        (s.client_bytes_sent, s.client_bytes_received)
    })
    .await;
    eprintln!(
        "refused 10 MB upload: {sent} bytes sent to the home, {received} received back, \
         {} speculative body bytes",
        a.rpc.stats().speculative_bytes_sent
    );
    let bound = MAX_SPECULATIVE_BODY_BYTES as u64 + FRAMING_ALLOWANCE;
    assert!(
        sent <= bound,
        "sent {sent} bytes to the refusing home (bound {bound})"
    );
    assert!(
        received <= bound,
        "got {received} bytes back from the refusing home (bound {bound})"
    );
    assert!(a.rpc.stats().speculative_bytes_sent <= MAX_SPECULATIVE_BODY_BYTES as u64);

    assert_eq!(a.rpc.stats().refusals_received, 1);
    let sb = b.rpc.stats();
    assert_eq!(sb.refusals_sent(), 1);
    assert_eq!(sb.home.refused_no_memory, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_speculative_budget_bounds_what_a_refusal_costs_whatever_the_window() {
    // A budget below capnp-rpc's own flow-control window, so the bound seen
    // is the shard client's.
    const BUDGET: usize = 20_000;
    let (_pki, a, b) = two_nodes(|c| c.speculative_body_bytes = BUDGET, as_is).await;
    b.workers.can_host.store(false, Ordering::SeqCst);

    let data = pattern(TEN_MB);
    let forwarded = forward(&a, &b.home, "echo", streaming_body(data.clone(), 7_000)).await;
    assert_eq!(forwarded.outcome, ForwardOutcome::Refused);
    let echoed = collect(forwarded.response.into_body()).await.unwrap();
    assert!(
        echoed[..] == data[..],
        "locally served body differs from what was sent"
    );
    let (sent, received) = settled(|| {
        let s = a.rpc.stats();
        (s.client_bytes_sent, s.client_bytes_received)
    })
    .await;
    assert!(a.rpc.stats().speculative_bytes_sent <= BUDGET as u64);
    let bound = BUDGET as u64 + FRAMING_ALLOWANCE;
    assert!(
        sent <= bound,
        "sent {sent} bytes to the refusing home (bound {bound})"
    );
    assert!(
        received <= bound,
        "got {received} bytes back (bound {bound})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_home_over_its_per_worker_limit_refuses_the_next_request() {
    let (_pki, a, b) = two_nodes(as_is, |c| c.overload.max_in_flight_per_worker = 1).await;
    b.workers.hangs.store(true, Ordering::SeqCst);

    // The first request occupies the Worker's only slot on its home.
    let first = spawn_forward(&a, &b.home, "gate", streaming_body(b"first".to_vec(), 5));
    b.workers.wait_entered(1).await;

    let second = forward(&a, &b.home, "gate", streaming_body(b"second".to_vec(), 3)).await;
    assert_eq!(second.outcome, ForwardOutcome::Refused);
    assert_eq!(served_by(&second.response), "a");
    assert_eq!(
        &collect(second.response.into_body()).await.unwrap()[..],
        b"second"
    );
    assert_eq!(b.rpc.stats().home.refused_worker_busy, 1);

    b.workers.release.notify_waiters();
    let first = guard("first forward", first).await.unwrap();
    assert_eq!(first.outcome, ForwardOutcome::Sharded);
    assert_eq!(served_by(&first.response), "b");
    assert_eq!(
        &collect(first.response.into_body()).await.unwrap()[..],
        b"first"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_home_that_is_down_means_the_request_is_served_here_without_error() {
    let pki = Pki::new(&["a"]);
    let a = start_node(&pki, "a", |_| {}).await;
    let nothing_there = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        hearth_sharding::ring::Member::new("b", l.local_addr().unwrap())
    };

    for attempt in 0..2 {
        let forwarded = forward(
            &a,
            &nothing_there,
            "echo",
            streaming_body(pattern(100_000), 4096),
        )
        .await;
        assert!(
            matches!(forwarded.outcome, ForwardOutcome::Unavailable(_)),
            "attempt {attempt}: {:?}",
            forwarded.outcome
        );
        assert_eq!(forwarded.route(), Route::Fallback);
        assert_eq!(forwarded.response.status(), 200);
        assert_eq!(served_by(&forwarded.response), "a");
        assert_eq!(served_as(&forwarded.response), "fallback");
        let body = collect(forwarded.response.into_body()).await.unwrap();
        assert!(body[..] == pattern(100_000)[..]);
    }
    assert_eq!(a.rpc.stats().home_unavailable, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_home_that_dies_after_accepting_yields_a_502_and_no_replay() {
    let (_pki, a, b) = two_nodes(as_is, as_is).await;
    b.workers.hangs.store(true, Ordering::SeqCst);

    let pending = spawn_forward(
        &a,
        &b.home,
        "gate",
        streaming_body(b"do it once".to_vec(), 4),
    );
    b.workers.wait_entered(1).await;
    b.rpc.shutdown();

    let forwarded = guard("forward", pending).await.unwrap();
    assert!(
        matches!(forwarded.outcome, ForwardOutcome::FailedAfterAccept(_)),
        "{:?}",
        forwarded.outcome
    );
    assert_eq!(forwarded.response.status(), 502);
    let text = collect(forwarded.response.into_body()).await.unwrap();
    assert!(String::from_utf8_lossy(&text).contains("not retried"));
    // Not silently replayed on this node.
    assert_eq!(a.workers.served.load(Ordering::SeqCst), 0);
    assert_eq!(a.rpc.stats().failed_after_accept, 1);

    // With the home gone, the next request is served here.
    a.workers.hangs.store(false, Ordering::SeqCst);
    let next = forward(&a, &b.home, "echo", streaming_body(b"next".to_vec(), 4)).await;
    assert!(
        matches!(next.outcome, ForwardOutcome::Unavailable(_)),
        "{:?}",
        next.outcome
    );
    assert_eq!(served_by(&next.response), "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_disconnects_mid_request_frees_the_homes_slot() {
    let (pki, a, b) = two_nodes(as_is, as_is).await;
    b.workers.hangs.store(true, Ordering::SeqCst);

    let pending = spawn_forward(&a, &b.home, "gate", streaming_body(pattern(1 << 20), 8192));
    b.workers.wait_entered(1).await;
    assert_eq!(b.rpc.home_in_flight("gate"), 1);
    a.rpc.shutdown();

    eventually("the home's slot is freed", || {
        b.rpc.home_in_flight("gate") == 0
    })
    .await;
    eventually("the Worker's invocation is cancelled", || {
        b.workers.cancelled.load(Ordering::SeqCst) == 1
    })
    .await;
    let forwarded = guard("forward", pending).await.unwrap();
    assert!(
        matches!(forwarded.outcome, ForwardOutcome::FailedAfterAccept(_)),
        "{:?}",
        forwarded.outcome
    );

    // The home keeps serving others.
    let c = start_node(&pki, "a", |_| {}).await;
    b.workers.hangs.store(false, Ordering::SeqCst);
    assert_echo_sharded(&c, &b, "forward from another node", b"still here", 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_context_stack_travels_and_traces_reach_the_first_node() {
    let (_pki, a, b) = two_nodes(as_is, as_is).await;

    let received = Arc::new(Mutex::new(Vec::new()));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let reporter = {
        let received = received.clone();
        TraceReporter::origin(move |events| {
            received.lock().unwrap().extend(events);
            let _ = tx.send(());
        })
    };
    let frames = vec![
        ContextFrame {
            script_id: "dispatcher".into(),
            trust: TrustLevel::Platform,
            tail_workers: vec![TailWorkerConfig {
                script_id: "tail".into(),
            }],
            feature_flags: vec!["streams_enable_constructors".into()],
            ..ContextFrame::default()
        },
        ContextFrame {
            script_id: "trace".into(),
            ownership_override: Some("customer-7".into()),
            limits: LimitOverrides {
                cpu_ms: Some(25),
                memory_bytes: Some(32 << 20),
            },
            trust: TrustLevel::Untrusted,
            outbound: Some(OutboundWorkerConfig {
                script_id: "outbound".into(),
                params: vec![("customer".into(), "7".into())],
            }),
            ..ContextFrame::default()
        },
    ];
    let mut stack = ContextStack::with_frame(frames[0].clone(), Some(reporter));
    stack.push(frames[1].clone());

    let forwarded = guard(
        "forward",
        a.rpc.forward(
            &b.home,
            "trace",
            stack,
            request("/trace", streaming_body(vec![], 1)),
        ),
    )
    .await;
    assert_eq!(forwarded.outcome, ForwardOutcome::Sharded);
    assert_eq!(
        forwarded.response.status(),
        200,
        "{:?}",
        forwarded.response.headers()
    );
    assert_eq!(
        &collect(forwarded.response.into_body()).await.unwrap()[..],
        b"traced"
    );

    // Rebuilt on the home as the same native structs.
    assert_eq!(b.workers.contexts.lock().unwrap().as_slice(), &[frames]);
    // The home's report reached the first node's callback.
    guard("trace callback", rx.recv()).await;
    let events = received.lock().unwrap().clone();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].node, "b");
    assert_eq!(events[0].message, "hello from b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_home_that_answers_late_yields_a_502_and_never_a_second_run() {
    // One RPC thread on the home, so a Worker that blocks it makes every
    // answer from the home late.
    let (_pki, a, b) = two_nodes(
        |c| {
            c.dispatch_timeout = Duration::from_millis(200);
        },
        |c| c.threads = 1,
    )
    .await;

    let stuck = spawn_forward(&a, &b.home, "block", full(b"x"));
    b.workers.wait_entered(1).await;

    // Larger than an inline call: dispatch + fetch + body writes, all
    // pipelined, reach the home while its thread is blocked.
    let body = pattern(100_000);
    let late = forward(&a, &b.home, "echo", streaming_body(body, 4096)).await;
    assert!(
        matches!(late.outcome, ForwardOutcome::FailedAfterAccept(_)),
        "{:?}",
        late.outcome
    );
    assert_eq!(late.route(), Route::Sharded);
    assert_eq!(late.response.status(), 502);
    let text = collect(late.response.into_body()).await.unwrap();
    assert!(String::from_utf8_lossy(&text).contains("not retried"));

    let stuck = guard("the blocked forward", stuck).await.unwrap();
    assert_eq!(stuck.response.status(), 200);
    // The home may have run the late request once; this node never did.
    assert_eq!(a.workers.served.load(Ordering::SeqCst), 0);
    assert!(b.workers.served.load(Ordering::SeqCst) <= 2);
    assert_eq!(a.rpc.stats().failed_after_accept, 1);
    assert_eq!(a.rpc.stats().home_unavailable, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_shutdown_forwards_are_served_locally() {
    let (_pki, a, b) = two_nodes(as_is, as_is).await;
    guard("shutdown", a.rpc.shutdown_and_wait()).await;
    let forwarded = forward(&a, &b.home, "echo", streaming_body(b"local".to_vec(), 2)).await;
    assert!(
        matches!(forwarded.outcome, ForwardOutcome::Unavailable(_)),
        "{:?}",
        forwarded.outcome
    );
    assert_eq!(served_by(&forwarded.response), "a");
    assert_eq!(served_as(&forwarded.response), "fallback");
    assert_eq!(
        &collect(forwarded.response.into_body()).await.unwrap()[..],
        b"local"
    );
    // Served here like any request that could not reach its home, and
    // counted as such.
    assert_eq!(a.rpc.stats().home_unavailable, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_too_large_for_the_wire_never_cost_the_connection() {
    let (_pki, a, b) = two_nodes(as_is, as_is).await;

    let mut big = request("/echo", streaming_body(b"big head".to_vec(), 3));
    big.headers_mut().insert(
        "x-big",
        http::HeaderValue::from_str(&"r".repeat(300 * 1024)).unwrap(),
    );
    let forwarded = guard(
        "forward",
        a.rpc.forward(&b.home, "echo", ContextStack::new(), big),
    )
    .await;
    assert!(
        matches!(forwarded.outcome, ForwardOutcome::Unavailable(_)),
        "{:?}",
        forwarded.outcome
    );
    assert_eq!(served_by(&forwarded.response), "a");

    let forwarded = guard(
        "forward",
        a.rpc.forward(
            &b.home,
            "bighead",
            ContextStack::new(),
            request("/", streaming_body(vec![], 1)),
        ),
    )
    .await;
    assert_eq!(forwarded.outcome, ForwardOutcome::Sharded);
    assert_eq!(forwarded.response.status(), 502);

    let ok = forward(&a, &b.home, "echo", streaming_body(b"fine".to_vec(), 2)).await;
    assert_eq!(ok.outcome, ForwardOutcome::Sharded);
    assert_eq!(
        &collect(ok.response.into_body()).await.unwrap()[..],
        b"fine"
    );
    assert_eq!(
        a.rpc.stats().connections_opened,
        1,
        "the connection survived"
    );
}

/// What one forward costs on the wire, each way, on a connection that is
/// already open (bootstrap done): the difference of two snapshots once
/// the counters have settled (a `Finish` may leave a little later).
async fn wire_cost_of(
    a: &Node,
    b: &Node,
    forward: impl std::future::Future<Output = ()>,
) -> (MessageCounts, MessageCounts) {
    let snapshot = || {
        let s = a.rpc.stats();
        (s.client_messages_sent, s.client_messages_received)
    };
    let (sent0, received0) = settled(snapshot).await;
    let home0 = b.rpc.stats().server_messages_received;
    forward.await;
    let (sent, received) = settled(snapshot).await;
    let home = b.rpc.stats().server_messages_received;
    assert_eq!(
        home.since(&home0),
        sent.since(&sent0),
        "the home received what the caller sent"
    );
    (sent.since(&sent0), received.since(&received0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_request_and_its_small_response_take_one_call_and_one_return() {
    let (_pki, a, b) = two_nodes(as_is, as_is).await;
    // Opens the connection (bootstrap) so the next forward is counted alone.
    assert_echo_sharded(&a, &b, "warm-up", b"warm", 4).await;

    let (sent, received) = wire_cost_of(&a, &b, async {
        let forwarded = forward(&a, &b.home, "echo", full(b"ping")).await;
        assert_eq!(forwarded.outcome, ForwardOutcome::Sharded);
        assert_eq!(served_by(&forwarded.response), "b");
        assert_eq!(
            &collect(forwarded.response.into_body()).await.unwrap()[..],
            b"ping"
        );
    })
    .await;
    eprintln!("small request: sent {sent:?}, received {received:?}");
    // One call out, one return back, and nothing the caller waits for in
    // between: no `fetch`, no body streams, no response sink calls.
    assert_eq!((sent.calls, sent.returns), (1, 0), "sent {sent:?}");
    assert_eq!(
        (received.calls, received.returns),
        (0, 1),
        "received {received:?}"
    );
    // The rest is bookkeeping: the caller's `Finish`, the home's releases of
    // the two capabilities the call carried (lazy instance, response sink).
    assert!(sent.finishes <= 1 && sent.other == 0, "sent {sent:?}");
    assert!(
        received.releases <= 2 && received.other == 0,
        "received {received:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_body_still_streams_in_many_writes_with_the_same_result() {
    let (_pki, a, b) = two_nodes(as_is, as_is).await;
    assert_echo_sharded(&a, &b, "warm-up", b"warm", 4).await;

    let data = pattern(MAX_INLINE_BODY_BYTES * 8);
    let (sent, received) = wire_cost_of(&a, &b, async {
        assert_echo_sharded(&a, &b, "large forward", &data, 16 * 1024).await;
    })
    .await;
    eprintln!("512 KiB request: sent {sent:?}, received {received:?}");
    // `dispatch`, `fetch` and body `write`s one way; `start` and body
    // `write`s the other: far more than one call each way.
    assert!(sent.calls >= 8, "sent {sent:?}");
    assert!(received.calls >= 8, "received {received:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_request_refused_by_its_home_is_served_here_after_one_round_trip() {
    let (_pki, a, b) = two_nodes(as_is, as_is).await;
    assert_echo_sharded(&a, &b, "warm-up", b"warm", 4).await;
    b.workers.can_host.store(false, Ordering::SeqCst);

    let (sent, received) = wire_cost_of(&a, &b, async {
        let forwarded = forward(&a, &b.home, "echo", full(b"come back")).await;
        assert_eq!(forwarded.outcome, ForwardOutcome::Refused);
        assert_eq!(
            forwarded.response.status(),
            200,
            "a refusal is not an error"
        );
        assert_eq!(served_by(&forwarded.response), "a");
        assert_eq!(served_as(&forwarded.response), "fallback");
        assert_eq!(
            &collect(forwarded.response.into_body()).await.unwrap()[..],
            b"come back"
        );
    })
    .await;
    // The home answers with the caller's own capability: still one call and
    // one return, and nothing ran there.
    assert_eq!((sent.calls, received.returns, received.calls), (1, 1, 0));
    assert_eq!(a.workers.served.load(Ordering::SeqCst), 1);
    assert_eq!(
        b.workers.served.load(Ordering::SeqCst),
        1,
        "only the warm-up"
    );
    assert_eq!(a.rpc.stats().refusals_received, 1);
    assert_eq!(b.rpc.stats().refusals_sent(), 1);
}
