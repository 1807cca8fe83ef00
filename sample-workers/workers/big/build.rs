//! Generates the `big` Worker's payload into `OUT_DIR` with the shared
//! generator `payload_gen.rs`: [`DATA_LEN`] bytes of incompressible data and
//! [`FUNCS`] generated functions (see that file).

#[path = "payload_gen.rs"]
mod payload_gen;

/// 5.5 MiB of data: with the code, gzip size ~5.9 MiB (between 3 and 10 MiB).
const DATA_LEN: usize = 5 * 1024 * 1024 + 512 * 1024;
/// Number of generated functions (~1 MB of code).
const FUNCS: usize = 4096;

fn main() {
    payload_gen::generate(DATA_LEN, FUNCS, payload_gen::SEED);
}
