//! `fetcher`: fetches the URL in request header `x-fetch` (an origin on the
//! network, which hearth reaches only if the deploy allows it; see
//! `hearth_runtime::outbound::egress`), `x-fetch-count` times (default 1), one after
//! another, and answers 200 with one line per fetch:
//!
//! ```text
//! 200 <the origin's body>
//! 302 location=http://127.0.0.1:9/
//! error HTTP error: ErrorCode::DestinationIpProhibited
//! ```
//!
//! A 3xx line shows its `location` instead of its body (hearth does not
//! follow redirects; the Worker sees them).
//!
//! Without `x-fetch`, the URL is whatever follows the first `fetch=` in
//! the request's query, taken as is to the end (`/?fetch=http://a/b?c=d`
//! fetches `http://a/b?c=d`): a request made by another Worker, which
//! sends no headers of the client's, can still name it (the outbound
//! Worker test: a user Worker's subrequest reaches `fetcher` as its
//! outbound Worker, which fetches the origin its query names). With
//! neither it answers 400.

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
        let url = url.or_else(|| {
            let path = hearth_sdk::path(&request);
            let query = path.split_once('?')?.1;
            let at = query.find("fetch=")?;
            Some(query[at + "fetch=".len()..].to_string())
        });
        let Some(url) = url else {
            let _ = hearth_sdk::respond(out, 400, &[], b"set x-fetch: <url>, or ?fetch=<url>\n");
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
