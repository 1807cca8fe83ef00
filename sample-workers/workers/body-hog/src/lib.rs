//! `body-hog`: parks host memory in outgoing bodies. `GET /<mode>/<n>`
//! creates `n` outgoing requests, writes 2 MiB into the body of each,
//! finishes it and never sends the request; every request is kept in a
//! global, so on a reused instance they pile up request after request.
//!
//! * `greedy`: writes 1 MiB at a time without asking (`write` as soon as
//!   `check-write` grants anything), as a host with 1 MiB chunks allows;
//! * `fill`: writes what `check-write` grants until it grants nothing, then
//!   goes on to the next body (the most a polite guest can park).
//!
//! Answers 200 `"held <total> bodies, <bytes> bytes"` (this instance's
//! totals) if every call succeeded, else 507 naming the failed call; a host
//! that refuses an over-large write traps the instance.

use std::cell::RefCell;

use hearth_sdk::wasi::http::types::{Fields, OutgoingBody, OutgoingRequest};
use hearth_sdk::{Guest, IncomingRequest, ResponseOutparam};

thread_local! {
    /// The requests never sent, and the bytes written into their bodies.
    static HOARD: RefCell<(Vec<OutgoingRequest>, u64)> = const { RefCell::new((Vec::new(), 0)) };
}

const PER_BODY: usize = 2 << 20;
const BLOCK: usize = 1 << 20;

struct BodyHog;

/// Creates one request and parks up to [`PER_BODY`] bytes in its body.
fn park(greedy: bool, block: &[u8]) -> Result<(OutgoingRequest, u64), String> {
    let req = OutgoingRequest::new(Fields::new());
    let body = req.body().map_err(|()| "body refused".to_string())?;
    let mut written = 0usize;
    {
        let stream = body
            .write()
            .map_err(|()| "body stream refused".to_string())?;
        while written < PER_BODY {
            let granted = stream
                .check_write()
                .map_err(|e| format!("check-write after {written} bytes: {e:?}"))?
                as usize;
            if granted == 0 {
                break;
            }
            let n = if greedy { BLOCK } else { granted.min(BLOCK) };
            stream
                .write(&block[..n])
                .map_err(|e| format!("write after {written} bytes: {e:?}"))?;
            written += n;
        }
    }
    OutgoingBody::finish(body, None).map_err(|e| format!("finish: {e:?}"))?;
    Ok((req, written as u64))
}

impl Guest for BodyHog {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let path = hearth_sdk::path(&request);
        let mut parts = path.trim_start_matches('/').split('/');
        let greedy = parts.next() != Some("fill");
        let n: usize = parts.next().and_then(|s| s.parse().ok()).unwrap_or(100);
        let block = vec![0x5a_u8; BLOCK];
        for _ in 0..n {
            match park(greedy, &block) {
                Ok((req, bytes)) => HOARD.with(|h| {
                    let mut h = h.borrow_mut();
                    h.0.push(req);
                    h.1 += bytes;
                }),
                Err(e) => {
                    let _ = hearth_sdk::respond(out, 507, &[], e.as_bytes());
                    return;
                }
            }
        }
        let body = HOARD.with(|h| {
            let h = h.borrow();
            format!("held {} bodies, {} bytes", h.0.len(), h.1)
        });
        let _ = hearth_sdk::respond(out, 200, &[], body.as_bytes());
    }
}

hearth_sdk::export_worker!(BodyHog);
