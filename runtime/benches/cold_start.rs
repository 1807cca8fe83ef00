//! Cold start and warm request costs, printed as markdown tables.
//!
//! `cargo bench -p hearth-runtime --bench cold_start`
//!
//! 1. Cold start phases per component size (~100 KB `hello`, ~1 MB
//!    `size-1m`, ~5 MB class `big`, ~10 MB `size-10m`; all but `hello` are
//!    real generated code plus incompressible data) and for the JS and
//!    Python samples, compiling vs loading the precompiled artifact (the
//!    whole cold request from the artifact, and the first load after a
//!    restart, which checks the artifact's MAC).
//! 2. Instantiation with the pooling allocator vs on demand.
//! 3. A warm in-process request through hearth vs a plain
//!    wasmtime-wasi-http handler (new `Store` per request, as `wasmtime
//!    serve` does) on the same component, in the same run.

use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, Store};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::p2::bindings::ProxyPre;
use wasmtime_wasi_http::p2::bindings::http::types::Scheme;
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use hearth_runtime::body;
use hearth_runtime::{Plan, ReusePolicy, Runtime, RuntimeConfig, Timing};

fn req(id: &str) -> http::Request<hearth_runtime::Body> {
    http::Request::get(format!("http://{id}.localhost/"))
        .body(body::full(""))
        .expect("request")
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

fn us(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn drain(resp: http::Response<hearth_runtime::Body>) {
    let _ = resp.into_body().collect().await;
}

async fn cold_phases(rt: &Runtime, id: &str) -> Timing {
    rt.evict(id);
    let served = rt.handle(id, req(id)).await.expect("served");
    assert_eq!(served.response.status(), 200, "{id} did not respond 200");
    drain(served.response).await;
    served.timing
}

struct Plain {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    table: ResourceTable,
    hooks: NoOutbound,
}

struct NoOutbound;

type SendResult = wasmtime_wasi_http::Result<(
    http::Response<wasmtime_wasi_http::WasiBody>,
    Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
)>;

impl wasmtime_wasi_http::WasiHttpHooks for NoOutbound {
    fn send_request(
        &mut self,
        _request: http::Request<wasmtime_wasi_http::WasiBody>,
        _options: Option<wasmtime_wasi_http::RequestOptions>,
        _fut: Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
    ) -> Box<dyn Future<Output = SendResult> + Send> {
        Box::new(async { Err(wasmtime_wasi_http::Error::HttpRequestDenied) })
    }
}
impl WasiView for Plain {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}
impl WasiHttpView for Plain {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

/// The plain wasmtime-wasi-http baseline: one new store per request.
async fn plain_request(engine: &Engine, pre: &ProxyPre<Plain>) {
    let mut store = Store::new(
        engine,
        Plain {
            wasi: WasiCtxBuilder::new()
                .env("HEARTH_SCRIPT_ID", "hello")
                .build(),
            http: WasiHttpCtx::new(),
            table: ResourceTable::new(),
            hooks: NoOutbound,
        },
    );
    let proxy = pre
        .instantiate_async(&mut store)
        .await
        .expect("instantiate");
    let (tx, rx) = tokio::sync::oneshot::channel();
    let r = req("hello")
        .map(|b| b.map_err(|e| wasmtime_wasi_http::Error::InternalError(Some(e.to_string()))));
    let r = store
        .data_mut()
        .http()
        .new_incoming_request(Scheme::Http, r)
        .expect("req");
    let out = store
        .data_mut()
        .http()
        .new_response_outparam(tx)
        .expect("out");
    let task = tokio::spawn(async move {
        proxy
            .wasi_http_incoming_handler()
            .call_handle(&mut store, r, out)
            .await
    });
    let resp = rx.await.expect("sent").expect("ok");
    let _ = resp.into_body().collect().await;
    let _ = task.await;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = Runtime::new(RuntimeConfig::new(dir.path()).artifact_key([1; 32])).expect("runtime");
    // (sample, script id, size class). `big` (6.9 MB raw, gzip 5.9 MiB)
    // stands for the ~5 MB class.
    let samples = [
        ("hello", "hello", "~100 KB"),
        ("size-1m", "size-1m", "~1 MB"),
        ("big", "big", "~5 MB"),
        ("size-10m", "size-10m", "~10 MB"),
        ("js", "js", "JS (componentize-js)"),
        ("python", "python", "Python (componentize-py)"),
    ];

    println!("## Cold start phases (ms), compile vs precompiled artifact\n");
    println!(
        "| component | class | size (KiB) | gzip (KiB) | lifecycle | fetch | compile | load artifact | instantiate | handler | cold total, from artifact | load artifact, first after restart |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (sample, id, class) in samples {
        if let Some(why) = hearth_sample_workers::skipped(sample) {
            eprintln!("no {sample} row: {why}");
            continue;
        }
        let bytes = hearth_sample_workers::bytes(sample).expect("sample");
        let report = rt
            .deploy(id, Plan::Paid, bytes.clone())
            .await
            .expect("deploy");
        // Compile from source: delete the artifact first.
        let _ = std::fs::remove_file(rt.artifacts().path(&report.meta.hash));
        let compiled = cold_phases(&rt, id).await;
        let mut loads = Vec::new();
        let mut totals = Vec::new();
        let mut last = Timing::default();
        for _ in 0..5 {
            let t = Instant::now();
            last = cold_phases(&rt, id).await;
            totals.push(t.elapsed());
            loads.push(last.compile.unwrap_or_default());
        }
        // A restarted node checks each artifact's MAC once, on first load.
        let rt2 =
            Runtime::new(RuntimeConfig::new(dir.path()).artifact_key([1; 32])).expect("runtime");
        let first = cold_phases(&rt2, id).await;
        drop(rt2);
        println!(
            "| {sample} | {class} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            bytes.len() / 1024,
            report.meta.compressed_size / 1024,
            report.meta.lifecycle.chosen,
            ms(last.fetch.unwrap_or_default()),
            ms(compiled.compile.unwrap_or_default()),
            ms(median(loads)),
            ms(last.instantiate.unwrap_or_default()),
            ms(last.handler.unwrap_or_default()),
            ms(median(totals)),
            ms(first.compile.unwrap_or_default()),
        );
    }

    println!("\n## Instantiation (µs, median of 300), hello, fresh instance per request\n");
    println!("| allocator | instantiate | whole request |");
    println!("|---|---|---|");
    for pooling in [true, false] {
        let d = tempfile::tempdir().expect("tempdir");
        let rt = Runtime::new(
            RuntimeConfig::new(d.path())
                .pooling(pooling)
                .reuse(ReusePolicy::fresh_per_request()),
        )
        .expect("runtime");
        rt.deploy(
            "hello",
            Plan::Free,
            hearth_sample_workers::bytes("hello").expect("hello"),
        )
        .await
        .expect("deploy");
        let mut inst = Vec::new();
        let mut whole = Vec::new();
        for i in 0..330 {
            let t = Instant::now();
            let s = rt.handle("hello", req("hello")).await.expect("served");
            drain(s.response).await;
            if i >= 30 {
                whole.push(t.elapsed());
                inst.push(s.timing.instantiate.unwrap_or_default());
            }
        }
        println!(
            "| {} | {} | {} |",
            if pooling {
                "pooling + CoW"
            } else {
                "on demand"
            },
            us(median(inst)),
            us(median(whole))
        );
    }

    println!("\n## Warm in-process request, hello (µs per request, median of 7 batches of 500)\n");
    println!("| handler | per request | ratio to plain |");
    println!("|---|---|---|");
    let mut cfg = Config::new();
    cfg.allocation_strategy(InstanceAllocationStrategy::pooling());
    let engine = Engine::new(&cfg).expect("engine");
    let component = Component::new(
        &engine,
        hearth_sample_workers::bytes("hello").expect("hello"),
    )
    .expect("compile");
    let mut linker = Linker::<Plain>::new(&engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker).expect("wasi");
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker).expect("http");
    let pre = ProxyPre::new(linker.instantiate_pre(&component).expect("pre")).expect("proxy");
    let batch = 500;
    let mut plain = Vec::new();
    let mut reuse = Vec::new();
    let mut fresh = Vec::new();
    let d = tempfile::tempdir().expect("tempdir");
    let rt_fresh =
        Runtime::new(RuntimeConfig::new(d.path()).reuse(ReusePolicy::fresh_per_request()))
            .expect("rt");
    rt_fresh
        .deploy(
            "hello",
            Plan::Free,
            hearth_sample_workers::bytes("hello").expect("hello"),
        )
        .await
        .expect("deploy");
    rt.deploy(
        "hello",
        Plan::Free,
        hearth_sample_workers::bytes("hello").expect("hello"),
    )
    .await
    .expect("deploy");
    for _ in 0..7 {
        let t = Instant::now();
        for _ in 0..batch {
            plain_request(&engine, &pre).await;
        }
        plain.push(t.elapsed() / batch);
        for (rt, out) in [(&rt, &mut reuse), (&rt_fresh, &mut fresh)] {
            let t = Instant::now();
            for _ in 0..batch {
                drain(rt.serve("hello", req("hello")).await).await;
            }
            out.push(t.elapsed() / batch);
        }
    }
    let base = median(plain.clone());
    for (name, v) in [
        ("plain wasmtime-wasi-http (new store per request)", plain),
        ("hearth, instance reuse (default)", reuse),
        ("hearth, fresh instance per request", fresh),
    ] {
        let m = median(v);
        println!(
            "| {name} | {} | {:.2} |",
            us(m),
            m.as_secs_f64() / base.as_secs_f64()
        );
    }
}
