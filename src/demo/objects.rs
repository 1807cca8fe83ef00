//! `hearth demo objects`: Durable Objects spread over the ring, and
//! surviving the loss of a node.
//!
//! A 3-node in-process cluster on loopback (one store and one fence file
//! shared, as nodes on one machine share them), [`COUNTER`] deployed with
//! its `COUNTER` binding: Cloudflare's counter, in JavaScript, built with
//! hearth's engine. `--objects` counters, each incremented `--increments`
//! times through the front doors in turn; the table says which node is
//! each one's ring home and which node served its increments (only the
//! home). Then the node that is home to the most objects is stopped as a
//! crash stops it (its listeners and connections dropped, nothing
//! flushed), and every counter is incremented once more through the
//! survivors: each must count on from its last answer, served by its new
//! home.
//!
//! ```sh
//! hearth demo objects --objects 24 --increments 5
//! ```

use std::time::{Duration, Instant};

use hearth_report::latency::Distribution;
use hearth_report::table::{Align, Table};
use serde::Serialize;

use super::DemoError;
use crate::testing::{TestCluster, build_js};

/// The demo's Worker: Cloudflare's counter (issue 43) with two reads:
/// `POST /<name>/` increments the object called `<name>` and answers its new
/// count, `GET /<name>/` answers the count, `GET /<name>/id` the object's
/// ID. The Durable Objects bench (`benches/objects_counter.rs`) runs the
/// same Worker.
pub const COUNTER: &str = r#"import { DurableObject } from "cloudflare:workers";
export class Counter extends DurableObject {
  async fetch(request) {
    let n = (await this.ctx.storage.get("n")) ?? 0;
    if (request.method === "POST") {
      n += 1;
      await this.ctx.storage.put("n", n);
    }
    return new Response(String(n));
  }
}
export default {
  async fetch(request, env) {
    const [, name, what] = new URL(request.url).pathname.split("/");
    const id = env.COUNTER.idFromName(name);
    if (what === "id") return new Response(id.toString());
    return env.COUNTER.get(id).fetch(request);
  },
};
"#;

/// The script ID the demo deploys [`COUNTER`] as.
const SCRIPT: &str = "counter";

/// Answers other than 200 one increment may get before the demo gives up
/// on it (a call cut by the crash is a 502, never replayed; the client
/// tries again, as a client would).
const TRIES: u32 = 4;

/// Flags of `hearth demo objects`.
#[derive(clap::Args, Debug, Clone)]
pub struct ObjectsDemoArgs {
    /// Nodes in the cluster (at least 2: one is stopped).
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Counters (Durable Objects), named `obj-0`, `obj-1`, ...
    #[arg(long, default_value_t = 24)]
    pub objects: usize,
    /// Increments of each counter before the crash.
    #[arg(long, default_value_t = 5)]
    pub increments: u64,
}

impl ObjectsDemoArgs {
    /// Refuses flags the demo cannot run with, naming the flag.
    fn check(&self) -> Result<(), DemoError> {
        if self.nodes < 2 {
            return Err(DemoError::Usage("--nodes must be at least 2"));
        }
        if self.objects < 1 {
            return Err(DemoError::Usage("--objects must be at least 1"));
        }
        if self.increments < 1 {
            return Err(DemoError::Usage("--increments must be at least 1"));
        }
        Ok(())
    }
}

/// One node's share, before and after the crash.
#[derive(Debug, Clone, Serialize)]
pub struct NodeRow {
    /// Its node ID.
    pub id: String,
    /// Objects whose ring home it was before the crash.
    pub homes_before: usize,
    /// Object requests it served before the crash.
    pub served_before: u64,
    /// Objects whose home it is after (0 for the stopped node).
    pub homes_after: usize,
    /// Object requests it served after.
    pub served_after: u64,
}

/// What the demo saw.
#[derive(Debug, Clone, Serialize)]
pub struct ObjectsDemoReport {
    /// Per node.
    pub nodes: Vec<NodeRow>,
    /// The stopped node's ID.
    pub stopped: String,
    /// Objects whose home was the stopped node.
    pub moved: usize,
    /// Objects whose count went on from their last answer.
    pub counted_on: usize,
    /// Counters.
    pub objects: usize,
    /// Answers other than 200 after the crash (each tried again).
    pub errors: u32,
    /// The first increment after the crash (of a counter that moved),
    /// which waits for the ring to drop the dead node, in ms.
    pub first_after_ms: f64,
    /// The others after the crash, p50 / p99 in ms.
    pub rest_after: String,
    /// Increments before the crash, p50 / p99 in ms.
    pub before: String,
}

/// One request to the counter through node `door`: status and body.
async fn call(
    c: &TestCluster,
    door: usize,
    method: http::Method,
    path: &str,
) -> Result<(u16, String), DemoError> {
    let r = c
        .send(door, SCRIPT, method, path, bytes::Bytes::new(), &[])
        .await?;
    Ok((r.status, r.text()))
}

/// Increments `name` through `door`, trying again after an error (at most
/// [`TRIES`] answers); the count and the errors seen.
async fn increment(c: &TestCluster, door: usize, name: &str) -> Result<(u64, u32), DemoError> {
    let mut errors = 0;
    loop {
        let (status, body) = call(c, door, http::Method::POST, &format!("/{name}/")).await?;
        if status == 200 {
            let n = body
                .trim()
                .parse()
                .map_err(|_| DemoError::Failed(format!("{name}: not a count: {body:?}")))?;
            return Ok((n, errors));
        }
        errors += 1;
        if errors >= TRIES {
            return Err(DemoError::Failed(format!(
                "{name} through node {door}: {status} {body}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Object requests each node has served so far.
fn served(c: &TestCluster) -> Vec<u64> {
    (0..c.nodes().len())
        .map(|i| c.stats(i).runtime.object_requests)
        .collect()
}

/// Runs the demo and prints what it saw.
pub async fn run(args: ObjectsDemoArgs) -> Result<ObjectsDemoReport, DemoError> {
    args.check()?;
    println!(
        "hearth demo objects: {} nodes, {} counters (Durable Objects, Cloudflare's counter in JS), \
         {} increments each, then the busiest node stops",
        args.nodes, args.objects, args.increments
    );
    let wasm =
        build_js(COUNTER).map_err(|e| DemoError::Failed(format!("building the counter: {e}")))?;
    let mut c = TestCluster::start(args.nodes).await?;
    let manifest =
        hearth_runtime::Manifest::from_toml("[durable_objects]\nCOUNTER = \"Counter\"\n")
            .map_err(|e| DemoError::Failed(e.to_string()))?;
    c.deploy_manifest(SCRIPT, manifest, wasm).await?;
    let names: Vec<String> = (0..args.objects).map(|i| format!("obj-{i}")).collect();
    let n = args.nodes;

    // Where each object lives: the ring's home of its key.
    let mut homes = Vec::new();
    for name in &names {
        let (status, id) = call(&c, 0, http::Method::GET, &format!("/{name}/id")).await?;
        if status != 200 {
            return Err(DemoError::Failed(format!("{name}/id: {status} {id}")));
        }
        let key = format!("do:{SCRIPT}/Counter/{}", id.trim());
        homes.push(
            c.home_of(&key)
                .ok_or_else(|| DemoError::Failed(format!("no home for {key}")))?,
        );
    }

    // Increments through every front door in turn.
    let start = served(&c);
    let mut before = Vec::new();
    let mut door = 0;
    for round in 1..=args.increments {
        for name in &names {
            door = (door + 1) % n;
            let t = Instant::now();
            let (count, _) = increment(&c, door, name).await?;
            before.push(t.elapsed().as_secs_f64() * 1e3);
            if count != round {
                return Err(DemoError::Failed(format!(
                    "{name}: count {count}, expected {round}"
                )));
            }
        }
    }
    let mid = served(&c);
    let homed = |homes: &[usize], i| homes.iter().filter(|&&h| h == i).count();
    let stopped = (0..n).max_by_key(|&i| homed(&homes, i)).unwrap_or(0);
    let stopped_id = c.node(stopped).node.id().to_string();
    let moved = homed(&homes, stopped);
    println!(
        "stopping {stopped_id} (home of {moved} of {} counters) as a crash would",
        args.objects
    );
    c.kill(stopped);

    // Once more through the survivors, the moved counters first (the
    // first of them waits for the ring to drop the dead node): every count
    // goes on.
    let survivors: Vec<usize> = (0..n).filter(|&i| i != stopped).collect();
    let mut order: Vec<usize> = (0..names.len()).collect();
    order.sort_by_key(|&k| homes[k] != stopped);
    let mut after = Vec::new();
    let (mut counted_on, mut errors) = (0, 0);
    for (j, &k) in order.iter().enumerate() {
        let name = &names[k];
        let door = survivors[j % survivors.len()];
        let t = Instant::now();
        let (count, e) = increment(&c, door, name).await?;
        after.push(t.elapsed().as_secs_f64() * 1e3);
        errors += e;
        // An error's request may have run (never twice): one more each.
        if count > args.increments && count <= args.increments + 1 + u64::from(e) {
            counted_on += 1;
        }
    }
    let end = served(&c);
    let mut homes_after = Vec::new();
    for name in &names {
        let (_, id) = call(&c, survivors[0], http::Method::GET, &format!("/{name}/id")).await?;
        let key = format!("do:{SCRIPT}/Counter/{}", id.trim());
        homes_after.push(c.home_of(&key).unwrap_or(stopped));
    }
    let nodes = (0..n)
        .map(|i| NodeRow {
            id: c.node(i).node.id().to_string(),
            homes_before: homed(&homes, i),
            served_before: mid[i] - start[i],
            homes_after: if i == stopped {
                0
            } else {
                homed(&homes_after, i)
            },
            served_after: end[i] - mid[i],
        })
        .collect();
    let report = ObjectsDemoReport {
        nodes,
        stopped: stopped_id,
        moved,
        counted_on,
        objects: args.objects,
        errors,
        first_after_ms: after.first().copied().unwrap_or_default(),
        rest_after: Distribution::of(after.get(1..).unwrap_or_default()).p50_p99(),
        before: Distribution::of(&before).p50_p99(),
    };
    println!("{}", table(&report));
    Ok(report)
}

/// The report as the demo prints it.
pub fn table(r: &ObjectsDemoReport) -> String {
    let mut t = Table::new([
        "node",
        "counters homed",
        "increments served",
        "homed after the stop",
        "served after",
    ])
    .align([
        Align::Left,
        Align::Right,
        Align::Right,
        Align::Right,
        Align::Right,
    ]);
    for row in &r.nodes {
        let stopped = row.id == r.stopped;
        t.row([
            if stopped {
                format!("{} (stopped)", row.id)
            } else {
                row.id.clone()
            },
            row.homes_before.to_string(),
            row.served_before.to_string(),
            if stopped {
                "-".into()
            } else {
                row.homes_after.to_string()
            },
            if stopped {
                "-".into()
            } else {
                row.served_after.to_string()
            },
        ]);
    }
    format!(
        "{t}\n{} of {} counters counted on from their last answer after {} stopped ({} had it as \
         their home and moved; {} answers other than 200 were tried again).\n\
         increments before: p50 / p99 {} ms; after the stop: the first {:.0} ms (it waits for the \
         ring to drop the dead node), the rest p50 / p99 {} ms",
        r.counted_on,
        r.objects,
        r.stopped,
        r.moved,
        r.errors,
        r.before,
        r.first_after_ms,
        r.rest_after,
    )
}
