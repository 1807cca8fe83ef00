//! `fan-out`: many subrequests at once. `GET /<n>` sends `n` requests to
//! its binding `next` (`http://next.internal/nap/<ms>`, `ms` from the
//! query `?ms=`, default 20) before waiting for any answer (one future
//! resource per call in flight, no pollable until it is awaited), then
//! awaits them in order and answers 200 `"<ok> ok, <failed> failed"`
//! (`ok` being a 2xx), the first failure on a second line (the first
//! error a call failed with, else the first non-2xx status).
//!
//! With `?spin=<ms>` instead, each call goes to `/spin/<ms>`.
//!
//! `GET /nap/<ms>` is the callee's side: it sleeps `ms` milliseconds
//! (a monotonic-clock pollable: no CPU) and answers 200 `"napped"`.
//! `GET /spin/<ms>` burns `ms` milliseconds of CPU (a busy loop on the
//! monotonic clock) and answers 200 `"spun"`.

use hearth_sdk::wasi::clocks::monotonic_clock;
use hearth_sdk::wasi::http::outgoing_handler;
use hearth_sdk::wasi::http::types::{Fields, OutgoingBody, OutgoingRequest, Scheme};
use hearth_sdk::{Guest, IncomingRequest, ResponseOutparam};

struct FanOut;

fn send(path: &str) -> Result<outgoing_handler::FutureIncomingResponse, String> {
    let req = OutgoingRequest::new(Fields::new());
    let _ = req.set_scheme(Some(&Scheme::Http));
    let _ = req.set_authority(Some("next.internal"));
    let _ = req.set_path_with_query(Some(path));
    let body = req.body().map_err(|()| "body refused".to_string())?;
    let pending = outgoing_handler::handle(req, None).map_err(|e| format!("handle: {e:?}"))?;
    OutgoingBody::finish(body, None).map_err(|e| format!("finish: {e:?}"))?;
    Ok(pending)
}

impl Guest for FanOut {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let path = hearth_sdk::path(&request);
        let (path, query) = path.split_once('?').unwrap_or((&path, ""));
        if let Some(ms) = path.strip_prefix("/nap/") {
            let ms: u64 = ms.parse().unwrap_or(20);
            monotonic_clock::subscribe_duration(ms * 1_000_000).block();
            let _ = hearth_sdk::respond(out, 200, &[], b"napped");
            return;
        }
        if let Some(ms) = path.strip_prefix("/spin/") {
            let ms: u64 = ms.parse().unwrap_or(10);
            let until = monotonic_clock::now() + ms * 1_000_000;
            while monotonic_clock::now() < until {
                core::hint::spin_loop();
            }
            let _ = hearth_sdk::respond(out, 200, &[], b"spun");
            return;
        }
        let n: usize = path.trim_start_matches('/').parse().unwrap_or(1000);
        let nap = if let Some(spin) = query.strip_prefix("spin=") {
            format!("/spin/{}", spin.parse::<u64>().unwrap_or(10))
        } else {
            let ms: u64 = query
                .strip_prefix("ms=")
                .and_then(|s| s.parse().ok())
                .unwrap_or(20);
            format!("/nap/{ms}")
        };
        let mut pending = Vec::with_capacity(n);
        let mut first_failure = None;
        let mut failed = 0usize;
        for _ in 0..n {
            match send(&nap) {
                Ok(p) => pending.push(p),
                Err(e) => {
                    failed += 1;
                    first_failure.get_or_insert(e);
                }
            }
        }
        let mut ok = 0usize;
        let mut first_status = None;
        for p in pending {
            let answer = loop {
                match p.get() {
                    Some(r) => break r,
                    None => p.subscribe().block(),
                }
            };
            match answer {
                Ok(Ok(resp)) if (200..300).contains(&resp.status()) => ok += 1,
                Ok(Ok(resp)) => {
                    failed += 1;
                    first_status.get_or_insert(format!("status {}", resp.status()));
                }
                Ok(Err(e)) => {
                    failed += 1;
                    first_failure.get_or_insert(format!("{e:?}"));
                }
                Err(()) => failed += 1,
            }
        }
        let mut body = format!("{ok} ok, {failed} failed");
        if let Some(e) = first_failure.or(first_status) {
            body.push('\n');
            body.push_str(&e);
        }
        let _ = hearth_sdk::respond(out, 200, &[], body.as_bytes());
    }
}

hearth_sdk::export_worker!(FanOut);
