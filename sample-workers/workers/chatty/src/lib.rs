//! `chatty`: a Worker that writes many log lines, for the bounds of a
//! traced flow. `GET /?lines=N&bytes=B&fan=F` writes `N` lines of `B`
//! bytes to stderr (each a `log` trace event when its flow is traced),
//! then calls its binding `next` `F` times, one after another, with
//! `?lines=N&bytes=B`, and answers 200 with the number of calls that
//! answered 200. `?late=MS` instead starts one call to `next` with
//! `?sleep=MS&lines=N&bytes=B` and answers at once without waiting for it,
//! so that call ends (and reports its events) after the flow's entry has
//! ended; `?sleep=MS` sleeps that long before logging and answering.

use hearth_sdk::fetch::Request;
use hearth_sdk::{Guest, IncomingRequest, ResponseOutparam};

struct Chatty;

fn param(query: &str, name: &str) -> u64 {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == name)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

impl Guest for Chatty {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let path = hearth_sdk::path(&request);
        let query = path.split_once('?').map(|(_, q)| q).unwrap_or("");
        let (lines, bytes) = (param(query, "lines"), param(query, "bytes"));
        let sleep = param(query, "sleep");
        if sleep > 0 {
            std::thread::sleep(std::time::Duration::from_millis(sleep));
        }
        let line = "x".repeat(bytes as usize);
        for i in 0..lines {
            eprintln!("{i} {line}");
        }
        let next = hearth_sdk::env().service("next");
        let late = param(query, "late");
        if late > 0 {
            let req = Request::get(&format!("/?sleep={late}&lines={lines}&bytes={bytes}"));
            let mut call = Box::pin(next.fetch_async(req));
            // Poll once, which sends the request, then leak the pending
            // response: the call goes on after this answer.
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            let _ = call.as_mut().poll(&mut cx);
            std::mem::forget(call);
            let _ = hearth_sdk::respond(out, 200, &[], b"answered before the call ended");
            return;
        }
        let mut ok = 0;
        for _ in 0..param(query, "fan") {
            let req = Request::get(&format!("/?lines={lines}&bytes={bytes}"));
            if next.fetch(req).is_ok_and(|r| r.status == 200) {
                ok += 1;
            }
        }
        let _ = hearth_sdk::respond(out, 200, &[], ok.to_string().as_bytes());
    }
}

hearth_sdk::export_worker!(Chatty);
