//! `big`: a deliberately large component (gzip size between 3 and 10 MiB,
//! ~5.6 MiB), for script-size limits and slow fetch/compile paths.
//!
//! It embeds 5.5 MiB of incompressible pseudo-random data and 4096 generated
//! functions (both from `build.rs`), and really uses both at request time, so
//! neither can be stripped: the response is a checksum of a 64 KiB slice of
//! the data chosen by the request path, mixed through the generated function
//! the checksum selects. Responds 200 with a one-line text summary.

use hearth_sdk::{Guest, IncomingRequest, ResponseOutparam};

/// The embedded incompressible data.
static DATA: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/data.bin"));

include!(concat!(env!("OUT_DIR"), "/gen.rs"));

/// Bytes summed per request.
const SLICE: usize = 64 * 1024;

/// FNV-1a over `bytes`.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The summary for `path`: which slice, its checksum, and the mixed value.
fn summary(path: &str) -> String {
    let span = DATA.len().saturating_sub(SLICE).max(1);
    let offset = (fnv1a(path.as_bytes()) % span as u64) as usize;
    let end = (offset + SLICE).min(DATA.len());
    let sum = fnv1a(&DATA[offset..end]);
    let f = (sum % GENERATED.len() as u64) as usize;
    let mixed = GENERATED[f](sum);
    format!(
        "big: {} bytes of data, {} generated functions; slice {offset}..{end} checksum {sum:016x}, gen_{f} -> {mixed:016x}\n",
        DATA.len(),
        GENERATED.len()
    )
}

struct Big;

impl Guest for Big {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let body = summary(&hearth_sdk::path(&request));
        let _ = hearth_sdk::respond(
            out,
            200,
            &[("content-type", b"text/plain")],
            body.as_bytes(),
        );
    }
}

hearth_sdk::export_worker!(Big);
