//! The web APIs (`Headers`, `Request`, `Response`, `URL`, streams, ...):
//! JS in `src/web/*.js`, evaluated in order as one script, and the natives
//! it calls, defined here as the object `__hearth_natives` before it runs.
//!
//! ## The model
//!
//! The classes are JS (a native call converts each of its arguments, which
//! costs more than the JS it would replace for small work such as a header
//! lookup). Natives do what JS cannot do, or does far slower: WHATWG URL
//! parsing and the `application/x-www-form-urlencoded` codec (the `url`
//! crate), UTF-8 (`TextEncoder`/`TextDecoder`, bodies), base64 (`atob`,
//! `btoa`), SHA digests and HMAC (`crypto.subtle`), randomness (wasi), and
//! writing `console` lines to stderr, which hearth delivers to
//! the Worker's log and tail Workers.
//!
//! A URL parse returns the serialized href and writes the boundaries of its
//! components into a caller's `Int32Array` (`OFF` in `url.js`), so each
//! getter is a slice of the href in JS, not another native call.
//!
//! The contract with `runtime.js` is `__hearth_web` (see `web/fetch.js`):
//! `incoming`, `outgoing`, `toFetch` and `fromFetch`.

use hmac::digest::KeyInit;
use hmac::{Hmac, Mac};
use rquickjs::{Ctx, FromJs, Function, Object, TypedArray, Value};
use sha1::Sha1;
use sha2::{Digest, Sha256, Sha384, Sha512};
use url::{Url, form_urlencoded, quirks};

/// The web APIs' JS: one script (the files share one scope), evaluated
/// after [`define`].
pub(crate) const WEB_JS: &str = concat!(
    "(() => {\n'use strict';\n",
    include_str!("web/base.js"),
    include_str!("web/url.js"),
    include_str!("web/streams.js"),
    include_str!("web/fetch.js"),
    "})();\n"
);

/// A JS string as a Rust `String`, whatever it holds: each lone surrogate
/// (a JS string may hold one, UTF-8 cannot) becomes U+FFFD, as WebIDL's
/// `USVString` conversion makes it. Every native takes its strings so:
/// rquickjs's `String` conversion fails on a lone surrogate instead, which
/// made `btoa`, `console.log` or a native of the URL classes throw an
/// `Error` of no web API, and failed the request (retiring the instance)
/// when it reached the answer's headers or body.
pub(crate) struct Usv(pub(crate) String);

impl<'js> FromJs<'js> for Usv {
    fn from_js(_: &Ctx<'js>, value: Value<'js>) -> rquickjs::Result<Self> {
        usv(&rquickjs::String::from_value(value)?).map(Usv)
    }
}

/// `s` as a Rust `String`, lone surrogates as U+FFFD (see [`Usv`]).
pub(crate) fn usv(s: &rquickjs::String<'_>) -> rquickjs::Result<String> {
    match s.to_string() {
        Err(rquickjs::Error::Utf8(_)) => {
            let c = s.clone().to_cstring()?;
            // SAFETY: QuickJS's buffer of `c.len()` bytes, alive while `c` is.
            let bytes = unsafe { std::slice::from_raw_parts(c.as_ptr().cast::<u8>(), c.len()) };
            Ok(wtf8_lossy(bytes))
        }
        other => other,
    }
}

/// QuickJS's UTF-8 of a string with lone surrogates (each one the three
/// bytes `ED A0..BF 80..BF`, as WTF-8 has it) as UTF-8, each lone surrogate
/// (and anything else that is not UTF-8) one U+FFFD.
fn wtf8_lossy(mut bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    loop {
        match std::str::from_utf8(bytes) {
            Ok(s) => {
                out.push_str(s);
                return out;
            }
            Err(e) => {
                let (valid, rest) = bytes
                    .split_at_checked(e.valid_up_to())
                    .unwrap_or((bytes, &[]));
                out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                out.push(char::REPLACEMENT_CHARACTER);
                let bad = match rest {
                    [0xED, 0xA0..=0xBF, 0x80..=0xBF, ..] => 3,
                    _ => e.error_len().unwrap_or(rest.len()),
                };
                bytes = rest.get(bad..).unwrap_or_default();
            }
        }
    }
}

/// The boundaries of `u`'s components in its serialization, in the order
/// of `OFF` in `url.js`: scheme end; username, password, hostname, port,
/// path, query and fragment, each as start and end (the query and fragment
/// without their `?` and `#`). A serialized URL is ASCII, so byte offsets
/// are JS indices.
///
/// They are worked out from the `url` crate's accessors, each a slice of
/// the serialization, and never by indexing it: its `Index<RangeTo<Position>>`
/// reads the byte after the username, which panics when there is none
/// (`foo://`), and a panic aborts the engine. Every boundary is clamped to
/// the serialization's length, so a getter slices within it whatever the
/// crate answers.
fn url_bounds(u: &Url) -> [usize; 15] {
    let len = u.as_str().len();
    let scheme_end = u.scheme().len();
    let separator = if u.has_authority() { "://" } else { ":" };
    let user_start = scheme_end + separator.len();
    let user_end = user_start + u.username().len();
    // `user:password@host`, `user@host` or `host`.
    let (password_start, password_end, host_start) = match u.password() {
        Some(p) => {
            let end = user_end + 1 + p.len();
            (user_end + 1, end, end + 1)
        }
        None if user_end > user_start => (user_end, user_end, user_end + 1),
        None => (user_end, user_end, user_end),
    };
    let host_end = host_start + u.host_str().map_or(0, str::len);
    let (port_start, port_end) = match u.port() {
        Some(p) => (host_end + 1, host_end + 1 + digits(p)),
        None => (host_end, host_end),
    };
    // The path, query and fragment, from the end: a path may follow a
    // `/.` that is no component (`web+demo:/.//p`).
    let (query_end, fragment_start) = match u.fragment() {
        Some(f) => (len.saturating_sub(f.len() + 1), len.saturating_sub(f.len())),
        None => (len, len),
    };
    let (path_end, query_start) = match u.query() {
        Some(q) => (
            query_end.saturating_sub(q.len() + 1),
            query_end.saturating_sub(q.len()),
        ),
        None => (query_end, query_end),
    };
    let path_start = path_end.saturating_sub(u.path().len());
    [
        scheme_end,
        user_start,
        user_end,
        password_start,
        password_end,
        host_start,
        host_end,
        port_start,
        port_end,
        path_start,
        path_end,
        query_start,
        query_end,
        fragment_start,
        len,
    ]
    .map(|b| b.min(len))
}

/// How many decimal digits `n` has.
fn digits(n: u16) -> usize {
    n.checked_ilog10().map_or(1, |l| l as usize + 1)
}

/// Writes `u`'s component boundaries ([`url_bounds`]) into `out`, an
/// `Int32Array` of at least 15 (one that is not is left as it is).
fn url_offsets(u: &Url, out: &TypedArray<'_, i32>) {
    let bounds = url_bounds(u);
    let Some(raw) = out.as_raw() else { return };
    if raw.len() < bounds.len() * 4 {
        return;
    }
    let p = raw.as_ptr() as *mut u8 as *mut i32;
    for (i, b) in bounds.into_iter().enumerate() {
        let at = i32::try_from(b).unwrap_or(i32::MAX);
        // SAFETY: in bounds (checked above); an Int32Array's data is 4-aligned,
        // and no JS runs while it is written.
        unsafe { p.add(i).write_unaligned(at) };
    }
}

/// `urlParse(input, base, out)`: the href of `input` parsed against `base`,
/// its boundaries in `out`; `undefined` if it does not parse.
fn url_parse(input: Usv, base: Option<Usv>, out: TypedArray<'_, i32>) -> Option<String> {
    let u = match base {
        Some(b) => Url::parse(&b.0).ok()?.join(&input.0).ok()?,
        None => Url::parse(&input.0).ok()?,
    };
    url_offsets(&u, &out);
    Some(u.into())
}

/// `urlSet(href, which, value, out)`: `href` after one of the URL
/// standard's setters (1 protocol, 2 username, 3 password, 4 host,
/// 5 hostname, 6 port, 7 pathname, 8 search, 9 hash), which ignore a value
/// they cannot take.
fn url_set(href: Usv, which: u32, value: Usv, out: TypedArray<'_, i32>) -> Option<String> {
    let mut u = Url::parse(&href.0).ok()?;
    let value = value.0;
    match which {
        1 => {
            let _ = quirks::set_protocol(&mut u, &value);
        }
        2 => {
            let _ = quirks::set_username(&mut u, &value);
        }
        3 => {
            let _ = quirks::set_password(&mut u, &value);
        }
        4 => {
            let _ = quirks::set_host(&mut u, &value);
        }
        5 => {
            let _ = quirks::set_hostname(&mut u, &value);
        }
        6 => {
            let _ = quirks::set_port(&mut u, &value);
        }
        7 => quirks::set_pathname(&mut u, &value),
        8 => quirks::set_search(&mut u, &value),
        9 => quirks::set_hash(&mut u, &value),
        _ => return None,
    }
    url_offsets(&u, &out);
    Some(u.into())
}

/// `urlOrigin(href)`: the URL's origin, serialized (`"null"` if opaque).
fn url_origin(href: Usv) -> String {
    Url::parse(&href.0)
        .map(|u| u.origin().ascii_serialization())
        .unwrap_or_else(|_| "null".into())
}

/// `formParse(s)`: `application/x-www-form-urlencoded` as
/// `[name, value, ...]`.
fn form_parse(s: Usv) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in form_urlencoded::parse(s.0.as_bytes()) {
        out.push(k.into_owned());
        out.push(v.into_owned());
    }
    out
}

/// `formSerialize([name, value, ...])`: the pairs as
/// `application/x-www-form-urlencoded`.
fn form_serialize(list: Vec<Usv>) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for p in list.chunks(2) {
        if let [k, v] = p {
            s.append_pair(&k.0, &v.0);
        }
    }
    s.finish()
}

/// `utf8Decode(bytes, fatal)`: the bytes as UTF-8, invalid sequences as
/// U+FFFD, or `undefined` if `fatal` and there is one.
fn utf8_decode(b: TypedArray<'_, u8>, fatal: bool) -> Option<String> {
    // SAFETY: read before any JS runs again.
    let bytes = unsafe { b.as_bytes() }.unwrap_or(&[]);
    if fatal {
        std::str::from_utf8(bytes).ok().map(str::to_owned)
    } else {
        Some(String::from_utf8_lossy(bytes).into_owned())
    }
}

/// `utf8Encode(string)`: the string's UTF-8 bytes (lone surrogates as
/// U+FFFD).
fn utf8_encode<'js>(ctx: Ctx<'js>, s: Usv) -> rquickjs::Result<TypedArray<'js, u8>> {
    TypedArray::new(ctx, s.0.into_bytes())
}

/// The base64 alphabet.
const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// `btoa(string)`: base64 of the string's code units as bytes, or
/// `undefined` if one is above U+00FF.
fn btoa(s: Usv) -> Option<String> {
    let mut bytes = Vec::with_capacity(s.0.len());
    for c in s.0.chars() {
        bytes.push(u8::try_from(u32::from(c)).ok()?);
    }
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let byte = |i: usize| u32::from(c.get(i).copied().unwrap_or(0));
        let n = (byte(0) << 16) | (byte(1) << 8) | byte(2);
        out.push(B64[(n >> 18) as usize & 63] as char);
        out.push(B64[(n >> 12) as usize & 63] as char);
        out.push(if c.len() > 1 {
            B64[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        out.push(if c.len() > 2 {
            B64[n as usize & 63] as char
        } else {
            '='
        });
    }
    Some(out)
}

/// `atob(string)`: the forgiving-base64 decode of the string, each byte a
/// code unit, or `undefined` if it is not base64.
fn atob(s: Usv) -> Option<String> {
    let mut v: Vec<u8> =
        s.0.bytes()
            .filter(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\x0c' | b'\r'))
            .collect();
    if v.len().is_multiple_of(4) && v.last() == Some(&b'=') {
        v.pop();
        if v.last() == Some(&b'=') {
            v.pop();
        }
    }
    if v.len() % 4 == 1 {
        return None;
    }
    let mut out = String::with_capacity(v.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for b in v {
        let d = B64.iter().position(|&c| c == b)? as u32;
        acc = (acc << 6) | d;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(char::from((acc >> bits) as u8));
        }
    }
    Some(out)
}

/// `digest(which, bytes)`: SHA-1 (1), SHA-256, SHA-384 or SHA-512 of the
/// bytes.
fn digest<'js>(
    ctx: Ctx<'js>,
    which: u32,
    b: TypedArray<'js, u8>,
) -> rquickjs::Result<TypedArray<'js, u8>> {
    // SAFETY: hashed before any JS runs again.
    let bytes = unsafe { b.as_bytes() }.unwrap_or(&[]);
    let out = match which {
        1 => Sha1::digest(bytes).to_vec(),
        256 => Sha256::digest(bytes).to_vec(),
        384 => Sha384::digest(bytes).to_vec(),
        _ => Sha512::digest(bytes).to_vec(),
    };
    TypedArray::new(ctx, out)
}

/// The HMAC of `data` under `key` with SHA-1 (1), SHA-256, SHA-384 or
/// SHA-512.
fn hmac_tag(which: u32, key: &[u8], data: &[u8]) -> Vec<u8> {
    fn tag<M: Mac + KeyInit>(key: &[u8], data: &[u8]) -> Vec<u8> {
        // HMAC takes a key of any length: this never fails.
        <M as KeyInit>::new_from_slice(key)
            .map(|m| m.chain_update(data).finalize().into_bytes().to_vec())
            .unwrap_or_default()
    }
    match which {
        1 => tag::<Hmac<Sha1>>(key, data),
        256 => tag::<Hmac<Sha256>>(key, data),
        384 => tag::<Hmac<Sha384>>(key, data),
        _ => tag::<Hmac<Sha512>>(key, data),
    }
}

/// Whether `a` and `b` are equal, every byte compared whatever the first
/// difference (their lengths are not secret).
fn equal_in_constant_time(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len()
        && std::hint::black_box(a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y))) == 0
}

/// `hmac(which, key, data)`: the HMAC tag (`crypto.subtle.sign`).
fn hmac<'js>(
    ctx: Ctx<'js>,
    which: u32,
    key: TypedArray<'js, u8>,
    data: TypedArray<'js, u8>,
) -> rquickjs::Result<TypedArray<'js, u8>> {
    // SAFETY: read before any JS runs again.
    let (k, d) = unsafe {
        (
            key.as_bytes().unwrap_or(&[]),
            data.as_bytes().unwrap_or(&[]),
        )
    };
    TypedArray::new(ctx, hmac_tag(which, k, d))
}

/// `hmacVerify(which, key, data, tag)`: whether `tag` is the HMAC of
/// `data` (`crypto.subtle.verify`).
fn hmac_verify<'js>(
    which: u32,
    key: TypedArray<'js, u8>,
    data: TypedArray<'js, u8>,
    tag: TypedArray<'js, u8>,
) -> bool {
    // SAFETY: read before any JS runs again.
    let (k, d, t) = unsafe {
        (
            key.as_bytes().unwrap_or(&[]),
            data.as_bytes().unwrap_or(&[]),
            tag.as_bytes().unwrap_or(&[]),
        )
    };
    equal_in_constant_time(&hmac_tag(which, k, d), t)
}

/// `timingSafeEqual(a, b)`: whether two buffers are equal
/// ([`equal_in_constant_time`]).
fn timing_safe_equal<'js>(a: TypedArray<'js, u8>, b: TypedArray<'js, u8>) -> bool {
    // SAFETY: read before any JS runs again.
    let (a, b) = unsafe { (a.as_bytes().unwrap_or(&[]), b.as_bytes().unwrap_or(&[])) };
    equal_in_constant_time(a, b)
}

/// `random(bytes)`: fills the `Uint8Array` from wasi:random.
fn random(b: TypedArray<'_, u8>) {
    let Some(raw) = b.as_raw() else { return };
    let r = hearth_sdk::wasi::random::random::get_random_bytes(raw.len() as u64);
    let n = r.len().min(raw.len());
    // SAFETY: `n` is within the array; no JS runs while it is written.
    unsafe { std::ptr::copy_nonoverlapping(r.as_ptr(), raw.as_ptr() as *mut u8, n) };
}

/// `uuid()`: a random (version 4) UUID.
fn uuid() -> String {
    let mut b = [0u8; 16];
    for (x, r) in b
        .iter_mut()
        .zip(hearth_sdk::wasi::random::random::get_random_bytes(16))
    {
        *x = r;
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let mut s = String::with_capacity(36);
    for (i, x) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// `log(line)`: one line on stderr (the Worker's log): line breaks in it
/// become spaces, so a console call is one log line (as the event loop's
/// own lines are).
fn log(line: Usv) {
    let line = line.0;
    if line.contains(['\n', '\r']) {
        crate::engine::write_log(&line.replace("\r\n", " ").replace(['\n', '\r'], " "));
    } else {
        crate::engine::write_log(&line);
    }
}

/// Defines `__hearth_natives` (the natives the web JS uses) on `ctx`'s
/// global object.
pub(crate) fn define(ctx: &Ctx<'_>) -> rquickjs::Result<()> {
    let n = Object::new(ctx.clone())?;
    n.set("urlParse", Function::new(ctx.clone(), url_parse)?)?;
    n.set("urlSet", Function::new(ctx.clone(), url_set)?)?;
    n.set("urlOrigin", Function::new(ctx.clone(), url_origin)?)?;
    n.set("formParse", Function::new(ctx.clone(), form_parse)?)?;
    n.set("formSerialize", Function::new(ctx.clone(), form_serialize)?)?;
    n.set("utf8Decode", Function::new(ctx.clone(), utf8_decode)?)?;
    n.set("utf8Encode", Function::new(ctx.clone(), utf8_encode)?)?;
    n.set("btoa", Function::new(ctx.clone(), btoa)?)?;
    n.set("atob", Function::new(ctx.clone(), atob)?)?;
    n.set("digest", Function::new(ctx.clone(), digest)?)?;
    n.set("hmac", Function::new(ctx.clone(), hmac)?)?;
    n.set("hmacVerify", Function::new(ctx.clone(), hmac_verify)?)?;
    n.set(
        "timingSafeEqual",
        Function::new(ctx.clone(), timing_safe_equal)?,
    )?;
    n.set("random", Function::new(ctx.clone(), random)?)?;
    n.set("uuid", Function::new(ctx.clone(), uuid)?)?;
    n.set("log", Function::new(ctx.clone(), log)?)?;
    ctx.globals().set("__hearth_natives", n)?;
    Ok(())
}
