//! The Worker code shared by the sized sample Workers (`big`, `size-1m`,
//! `size-10m`; the others include this file with `#[path]`).
//!
//! Each crate's build script generates, with `big/payload_gen.rs`, the
//! incompressible data `data.bin` and the generated functions `gen.rs` into
//! its own `OUT_DIR`, which this module embeds. Both are really used at
//! request time, so neither can be stripped: the response is a checksum of a
//! 64 KiB slice of the data chosen by the request path, mixed through the
//! generated function the checksum selects.

use hearth_sdk::{IncomingRequest, ResponseOutparam};

/// The embedded incompressible data.
static DATA: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/data.bin"));

include!(concat!(env!("OUT_DIR"), "/gen.rs"));

/// Bytes summed per request (or the whole data, if smaller).
const SLICE: usize = 64 * 1024;

/// FNV-1a over `bytes`.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The one-line summary for `path`, prefixed with the Worker's `name`: which
/// slice, its checksum, and the mixed value.
fn summary(name: &str, path: &str) -> String {
    let span = DATA.len().saturating_sub(SLICE).max(1);
    let offset = (fnv1a(path.as_bytes()) % span as u64) as usize;
    let end = (offset + SLICE).min(DATA.len());
    let sum = fnv1a(&DATA[offset..end]);
    let f = (sum % GENERATED.len() as u64) as usize;
    let mixed = GENERATED[f](sum);
    format!(
        "{name}: {} bytes of data, {} generated functions; slice {offset}..{end} checksum {sum:016x}, gen_{f} -> {mixed:016x}\n",
        DATA.len(),
        GENERATED.len()
    )
}

/// Serves any request: 200, `text/plain`, the [`summary`] for its path.
pub fn handle(name: &str, request: IncomingRequest, out: ResponseOutparam) {
    let body = summary(name, &hearth_sdk::path(&request));
    let _ = hearth_sdk::respond(
        out,
        200,
        &[("content-type", b"text/plain")],
        body.as_bytes(),
    );
}
