//! `fetcher`: fetches the URL in request header `x-fetch` (an origin on the
//! network, which hearth reaches only if the deploy allows it; see
//! `hearth_runtime::egress`), `x-fetch-count` times (default 1), one after
//! another, and answers 200 with one line per fetch:
//!
//! ```text
//! 200 <the origin's body>
//! 302 location=http://127.0.0.1:9/
//! error HTTP error: ErrorCode::DestinationIpProhibited
//! ```
//!
//! A 3xx line shows its `location` instead of its body (hearth does not
//! follow redirects; the Worker sees them). Without `x-fetch` it answers
//! 400.

use hearth_sdk::fetch::{self, Request};
use hearth_sdk::{Guest, IncomingRequest, ResponseOutparam};

struct Fetcher;

impl Guest for Fetcher {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let mut url = None;
        let mut count = 1u32;
        for (name, value) in hearth_sdk::headers(&request) {
            let value = String::from_utf8_lossy(&value).into_owned();
            if name.eq_ignore_ascii_case("x-fetch") {
                url = Some(value);
            } else if name.eq_ignore_ascii_case("x-fetch-count") {
                count = value.trim().parse().unwrap_or(1);
            }
        }
        let Some(url) = url else {
            let _ = hearth_sdk::respond(out, 400, &[], b"set x-fetch: <url>\n");
            return;
        };
        let mut body = String::new();
        for _ in 0..count {
            let line = match fetch::fetch(Request::get(&url)) {
                Ok(r) if (300..400).contains(&r.status) => format!(
                    "{} location={}",
                    r.status,
                    r.header("location").unwrap_or_default()
                ),
                Ok(r) => format!("{} {}", r.status, r.text()),
                Err(e) => format!("error {e}"),
            };
            body.push_str(&line);
            body.push('\n');
        }
        let _ = hearth_sdk::respond(out, 200, &[], body.as_bytes());
    }
}

hearth_sdk::export_worker!(Fetcher);
