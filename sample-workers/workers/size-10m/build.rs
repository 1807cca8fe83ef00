//! Generates the `size-10m` Worker's payload into `OUT_DIR` with `big`'s
//! generator (`../big/payload_gen.rs`): [`DATA_LEN`] bytes of incompressible
//! data and [`FUNCS`] generated functions, for a component of ~10 MB raw
//! whose gzip size (level 6) stays under the paid plan's 10 MiB limit, since
//! the code (~40% of it) compresses.

#[path = "../big/payload_gen.rs"]
mod payload_gen;

/// 5.5 MiB of incompressible data.
const DATA_LEN: usize = 5 * 1024 * 1024 + 512 * 1024;
/// Number of generated functions (~4 MB of code).
const FUNCS: usize = 16384;
/// Its own seed, so its data and code differ from `big`'s.
const SEED: u64 = payload_gen::SEED ^ 0x0000_0000_000a_0000;

fn main() {
    payload_gen::generate(DATA_LEN, FUNCS, SEED);
}
