//! `--features native`: `Headers` as a Rust class (a list of pairs, names
//! lower-cased), and the `Request` object made in Rust, so building the
//! request and reading the response's headers run no JS.

use rquickjs::class::Trace;
use rquickjs::function::Opt;
use rquickjs::{Array, Class, Ctx, JsLifetime, Object, Result, Value};

/// The Fetch `Headers`, in Rust.
#[derive(Trace, JsLifetime, Default)]
#[rquickjs::class(rename = "Headers")]
pub struct Headers {
    #[qjs(skip_trace)]
    pub list: Vec<(String, String)>,
}

fn lower(name: &str) -> String {
    name.to_ascii_lowercase()
}

#[rquickjs::methods]
impl Headers {
    #[qjs(constructor)]
    pub fn new<'js>(init: Opt<Value<'js>>) -> Result<Self> {
        let mut h = Headers::default();
        let Some(init) = init.0 else { return Ok(h) };
        if let Some(obj) = init.as_object() {
            if let Some(other) = Class::<Headers>::from_object(obj) {
                h.list = other.borrow().list.clone();
            } else if let Some(arr) = obj.as_array() {
                for pair in arr.iter::<Array>() {
                    let pair = pair?;
                    h.append(pair.get(0)?, pair.get(1)?);
                }
            } else {
                for kv in obj.props::<String, String>() {
                    let (k, v) = kv?;
                    h.append(k, v);
                }
            }
        }
        Ok(h)
    }

    pub fn get(&self, name: String) -> Option<String> {
        let at = |n: &str| {
            self.list
                .iter()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.clone())
        };
        at(&name).or_else(|| at(&lower(&name)))
    }

    pub fn has(&self, name: String) -> bool {
        let n = lower(&name);
        self.list.iter().any(|(k, _)| *k == n)
    }

    pub fn set(&mut self, name: String, value: String) {
        let n = lower(&name);
        self.list.retain(|(k, _)| *k != n);
        self.list.push((n, value));
    }

    pub fn append(&mut self, name: String, value: String) {
        let n = lower(&name);
        if let Some((_, v)) = self.list.iter_mut().find(|(k, _)| *k == n) {
            v.push_str(", ");
            v.push_str(&value);
        } else {
            self.list.push((n, value));
        }
    }

    pub fn delete(&mut self, name: String) {
        let n = lower(&name);
        self.list.retain(|(k, _)| *k != n);
    }

    /// `[[name, value], ...]`; the prelude makes `[Symbol.iterator]` and
    /// `entries()` iterate it.
    #[qjs(rename = "_pairs")]
    pub fn pairs<'js>(&self, ctx: Ctx<'js>) -> Result<Array<'js>> {
        let out = Array::new(ctx.clone())?;
        for (i, (k, v)) in self.list.iter().enumerate() {
            let pair = Array::new(ctx.clone())?;
            pair.set(0, k.as_str())?;
            pair.set(1, v.as_str())?;
            out.set(i, pair)?;
        }
        Ok(out)
    }
}

/// Defines `Headers` on the global object.
pub fn define(ctx: &Ctx<'_>) -> Result<()> {
    Class::<Headers>::define(&ctx.globals())
}

/// A `Request` (prototype `proto`) for one incoming request.
pub fn request<'js>(
    ctx: &Ctx<'js>,
    proto: &Object<'js>,
    method: &str,
    url: &str,
    headers: &[(String, Vec<u8>)],
    body: Value<'js>,
) -> Result<Value<'js>> {
    let mut h = Headers {
        list: Vec::with_capacity(headers.len()),
    };
    for (k, v) in headers {
        h.append(k.clone(), String::from_utf8_lossy(v).into_owned());
    }
    let h = Class::instance(ctx.clone(), h)?;
    let req = Object::new(ctx.clone())?;
    req.set_prototype(Some(proto))?;
    req.set("method", method)?;
    req.set("url", url)?;
    req.set("headers", h)?;
    req.set("_body", body)?;
    Ok(req.into_value())
}

/// The response's headers: the native list, or (a plain object set by
/// hand) an empty list.
pub fn response_headers(resp: &Object<'_>) -> Result<Vec<String>> {
    let h: Value = resp.get("headers")?;
    let mut out = Vec::new();
    if let Some(c) = h.as_object().and_then(Class::<Headers>::from_object) {
        for (k, v) in &c.borrow().list {
            out.push(k.clone());
            out.push(v.clone());
        }
    }
    Ok(out)
}
