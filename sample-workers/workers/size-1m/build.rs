//! Generates the `size-1m` Worker's payload into `OUT_DIR` with `big`'s
//! generator (`../big/payload_gen.rs`): [`DATA_LEN`] bytes of incompressible
//! data and [`FUNCS`] generated functions, for a component of ~1 MB raw.

#[path = "../big/payload_gen.rs"]
mod payload_gen;

/// 512 KiB of incompressible data.
const DATA_LEN: usize = 512 * 1024;
/// Number of generated functions (~0.4 MB of code).
const FUNCS: usize = 1536;
/// Its own seed, so its data and code differ from `big`'s.
const SEED: u64 = payload_gen::SEED ^ 0x0000_0000_0001_0000;

fn main() {
    payload_gen::generate(DATA_LEN, FUNCS, SEED);
}
