//! One request: the host's `incoming-request` made a JS `Request`,
//! `default.fetch(request, env, ctx)` run until its promise settles, and the
//! `Response` read back and sent.

use hearth_sdk::wasi::http::types::{Method, Scheme};
use hearth_sdk::{IncomingRequest, ResponseOutparam};
use rquickjs::function::This;
use rquickjs::{Array, ArrayBuffer, Function, Object, TypedArray, Value};

use crate::engine::{self, Engine, exception};

/// A method's name.
fn method(m: &Method) -> &str {
    match m {
        Method::Get => "GET",
        Method::Head => "HEAD",
        Method::Post => "POST",
        Method::Put => "PUT",
        Method::Delete => "DELETE",
        Method::Connect => "CONNECT",
        Method::Options => "OPTIONS",
        Method::Trace => "TRACE",
        Method::Patch => "PATCH",
        Method::Other(s) => s,
    }
}

/// What the Worker answered.
struct Answer {
    status: u16,
    /// Name and value, alternating.
    headers: Vec<String>,
    body: Vec<u8>,
}

/// A body value's bytes: a string (UTF-8), a `Uint8Array` or an
/// `ArrayBuffer`; anything else is empty.
fn body_bytes(v: Value<'_>) -> rquickjs::Result<Vec<u8>> {
    if let Some(s) = v.as_string() {
        return Ok(s.to_string()?.into_bytes());
    }
    if let Ok(t) = TypedArray::<u8>::from_value(v.clone()) {
        // SAFETY: copied at once.
        return Ok(unsafe { t.as_bytes() }.unwrap_or(&[]).to_vec());
    }
    if let Some(b) = ArrayBuffer::from_value(v.clone()) {
        // SAFETY: copied at once.
        return Ok(unsafe { b.as_bytes() }.unwrap_or(&[]).to_vec());
    }
    Ok(Vec::new())
}

/// Runs the Worker's `fetch` for one request.
fn serve(
    e: &Engine,
    method: &str,
    url: &str,
    headers: &[(String, Vec<u8>)],
    body: Option<Vec<u8>>,
) -> Result<Answer, String> {
    e.context.with(|ctx| {
        let go = || -> rquickjs::Result<Answer> {
            let body: Value = match body {
                Some(b) => TypedArray::<u8>::new(ctx.clone(), b)?.into_value(),
                None => Value::new_undefined(ctx.clone()),
            };
            let pairs = Array::new(ctx.clone())?;
            for (i, (k, v)) in headers.iter().enumerate() {
                pairs.set(2 * i, k.as_str())?;
                pairs.set(2 * i + 1, String::from_utf8_lossy(v).as_ref())?;
            }
            let request: Function = e.request.clone().restore(&ctx)?;
            let req: Value = request.call((method, url, pairs, body))?;
            let hearth = e.hearth.clone().restore(&ctx)?;
            let env: Value = hearth.get("env")?;
            let jsctx: Value = hearth.get("ctx")?;
            let fetch = e.fetch.clone().restore(&ctx)?;
            let default = e.default.clone().restore(&ctx)?;
            let result: Value = fetch.call((This(default), req, env, jsctx))?;
            let resp: Object = match result.as_promise() {
                Some(p) => p.finish::<Object>()?,
                None => Object::from_value(result)?,
            };
            let answer: Function = e.answer.clone().restore(&ctx)?;
            let parts: rquickjs::Promise = answer.call((resp,))?;
            let parts: Array = parts.finish()?;
            let status: u16 = parts.get(0)?;
            let headers: Vec<String> = parts.get(1)?;
            let body: Value = parts.get(2)?;
            let body = body_bytes(body)?;
            // ctx.waitUntil work and anything else queued: run it now.
            while ctx.execute_pending_job() {}
            Ok(Answer {
                status,
                headers,
                body,
            })
        };
        go().map_err(|err| exception(&ctx, err))
    })
}

/// Serves `request` through `out`.
pub(crate) fn handle(request: IncomingRequest, out: ResponseOutparam) {
    let m = request.method();
    let method = method(&m).to_owned();
    let path = hearth_sdk::path(&request);
    let authority = request.authority().unwrap_or_else(|| "localhost".into());
    let scheme = match request.scheme() {
        Some(Scheme::Https) => "https",
        _ => "http",
    };
    let url = format!("{scheme}://{authority}{path}");
    let headers = hearth_sdk::headers(&request);
    let body = if method == "GET" || method == "HEAD" {
        None
    } else {
        request.consume().ok().and_then(|b| {
            let s = b.stream().ok()?;
            let bytes = hearth_sdk::read_to_end(&s).ok();
            drop(s);
            bytes
        })
    };
    match engine::with(|e| serve(e, &method, &url, &headers, body)) {
        Ok(a) => {
            let mut hs: Vec<(&str, &[u8])> = a
                .headers
                .chunks(2)
                .filter(|c| c.len() == 2)
                .map(|c| (c[0].as_str(), c[1].as_bytes()))
                .collect();
            let len = a.body.len().to_string();
            if !a.headers.iter().step_by(2).any(|k| k == "content-length") {
                hs.push(("content-length", len.as_bytes()));
            }
            let _ = hearth_sdk::respond(out, a.status, &hs, &a.body);
        }
        Err(e) => {
            let _ = hearth_sdk::respond(
                out,
                500,
                &[("content-type", b"text/plain")],
                format!("js error: {e}").as_bytes(),
            );
        }
    }
}
