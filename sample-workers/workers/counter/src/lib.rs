//! `counter`: a Durable Object and the front Worker that calls it, in one
//! script (a Rust Worker has no classes: `this_object()` tells the two
//! apart). Deployed with `[durable_objects] COUNTER = "Counter"` (its own
//! class), or with `COUNTER = { class = "Counter", script = "<a script
//! deployed from this file>" }`.
//!
//! As the **object** (`this_object()` is some), its count lives in its
//! storage (key `n`, a decimal string), never in memory:
//!
//! | request | answer |
//! |---|---|
//! | `GET /` | increments the count; 200 with the new count |
//! | `GET /get` | 200 with the count |
//! | `GET /slow` | reads the count, waits 100 ms, writes count + 1 (two at once lose an increment unless they are serialized); 200 with the new count |
//! | `GET /big?bytes=N` | puts a value of N bytes; 200, or 413 with the storage error |
//! | `GET /whoami` | 200 `<class> <id> <name or ->` |
//! | `GET /url` | 200 with the URL the object's request has |
//! | `GET /alarm?in=MS` | sets the object's alarm MS ms from now; 200 with its time |
//! | `GET /alarm` | 200 with the alarm's time, or `none` |
//! | hearth's alarm call | increments the count; 204 |
//!
//! As the **front Worker**: `/<name>/<rest>` calls object `<name>`
//! (`id_from_name`) with `/<rest>`; `/id/<id>/<rest>` calls the object of
//! ID `<id>` (`id_from_string`); `?binding=B` uses binding `B` instead of
//! `COUNTER`; `?url=U` gives the object the URL `U` (else the query goes
//! on to the object). An ID error is 400,
//! a failed call 502, each with the error in the body. `/storage` tries the
//! storage outside an object: 409 with the error.

use hearth_sdk::fetch::{Request, Response};
use hearth_sdk::{Env, Worker};
use hearth_sdk_objects::{self as objects, storage};

struct Counter;

/// The value of query parameter `name` of `path`.
fn query<'a>(path: &'a str, name: &str) -> Option<&'a str> {
    path.split_once('?')?
        .1
        .split('&')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
}

/// The stored count.
fn count() -> Result<u64, storage::StorageError> {
    Ok(storage::get("n")?
        .and_then(|v| String::from_utf8(v).ok()?.parse().ok())
        .unwrap_or(0))
}

/// Stores `n` as the count.
fn store(n: u64) -> Result<(), storage::StorageError> {
    storage::put("n", n.to_string().as_bytes())
}

/// Waits `ms` milliseconds (wasi:clocks; the instance is idle meanwhile).
fn sleep(ms: u64) {
    hearth_sdk::wasi::clocks::monotonic_clock::subscribe_duration(ms * 1_000_000).block();
}

/// Milliseconds since the Unix epoch (wasi:clocks).
fn now_ms() -> u64 {
    let now = hearth_sdk::wasi::clocks::wall_clock::now();
    now.seconds * 1000 + u64::from(now.nanoseconds / 1_000_000)
}

fn object(req: &Request, me: objects::ThisObject) -> Result<Response, storage::StorageError> {
    if objects::alarm_info(req).is_some() {
        store(count()? + 1)?;
        return Ok(Response::new(204, ""));
    }
    let path = req.path();
    let route = path.split('?').next().unwrap_or("/");
    Ok(match route {
        "/" => {
            let n = count()? + 1;
            store(n)?;
            Response::new(200, n.to_string())
        }
        "/get" => Response::new(200, count()?.to_string()),
        "/slow" => {
            let n = count()?;
            sleep(100);
            store(n + 1)?;
            Response::new(200, (n + 1).to_string())
        }
        "/big" => {
            let bytes: usize = query(path, "bytes").and_then(|b| b.parse().ok()).unwrap_or(0);
            match storage::put("big", &vec![7u8; bytes]) {
                Ok(()) => Response::new(200, "stored"),
                Err(e) => Response::new(413, e.to_string()),
            }
        }
        "/whoami" => Response::new(
            200,
            format!("{} {} {}", me.class, me.id, me.name.as_deref().unwrap_or("-")),
        ),
        "/url" => Response::new(200, req.url.clone()),
        "/alarm" => match query(path, "in").and_then(|ms| ms.parse::<u64>().ok()) {
            Some(ms) => {
                let at = now_ms() + ms;
                storage::set_alarm(at)?;
                Response::new(200, at.to_string())
            }
            None => Response::new(
                200,
                storage::get_alarm()?.map_or("none".to_owned(), |at| at.to_string()),
            ),
        },
        _ => Response::new(404, "no such route"),
    })
}

fn front(req: &Request) -> Response {
    let path = req.path();
    let (route, query_string) = path.split_once('?').unwrap_or((path, ""));
    if route == "/storage" {
        return match storage::get("n") {
            Ok(_) => Response::new(200, "storage answered outside an object"),
            Err(e) => Response::new(409, e.to_string()),
        };
    }
    let binding = query(path, "binding").unwrap_or("COUNTER");
    let ns = objects::namespace(binding);
    let rest = route.trim_start_matches('/');
    let (id, rest) = match rest.split_once('/') {
        Some(("id", rest)) => {
            let (id, rest) = rest.split_once('/').unwrap_or((rest, ""));
            (ns.id_from_string(id), rest)
        }
        Some((name, rest)) => (ns.id_from_name(name), rest),
        None => (ns.id_from_name(rest), ""),
    };
    let id = match id {
        Ok(id) => id,
        Err(e) => return Response::new(400, e.to_string()),
    };
    let target = match query(path, "url") {
        Some(url) => url.to_owned(),
        None if query_string.is_empty() => format!("/{rest}"),
        None => format!("/{rest}?{query_string}"),
    };
    match ns.get(&id).fetch(Request::get(&target)) {
        Ok(r) => r,
        Err(e) => Response::new(502, format!("calling the object failed: {e}")),
    }
}

impl Worker for Counter {
    async fn fetch(req: Request, _env: Env) -> Response {
        match objects::this_object() {
            Some(me) => {
                object(&req, me).unwrap_or_else(|e| Response::new(500, e.to_string()))
            }
            None => front(&req),
        }
    }
}

hearth_sdk::export_fetch!(Counter);
