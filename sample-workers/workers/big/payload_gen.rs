//! The payload generator shared by the build scripts of the sized sample
//! Workers (`big`, `size-1m`, `size-10m`): each build script includes this
//! file with `#[path]` and calls [`generate`] with its own sizes.
//!
//! It writes into `OUT_DIR`:
//!
//! - `data.bin`: `data_len` bytes of xorshift64* output, i.e. incompressible
//!   (gzip cannot shrink it), so the component's compressed size is real;
//! - `gen.rs`: `funcs` distinct generated straight-line functions and a table
//!   of them (`GENERATED`), so the component also has a lot of real code (and
//!   a non-trivial compile time for the host's Cranelift, not just for rustc).
//!
//! Both are deterministic (fixed seed), so builds are reproducible. The
//! shared Worker code that uses them is `big/src/payload.rs`.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::PathBuf;

/// The seed `big` has always used ("hearth!!").
pub const SEED: u64 = 0x6865_6172_7468_2121;

/// xorshift64*: fast, deterministic, and its output does not compress.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Writes `data.bin` (`data_len` bytes) and `gen.rs` (`funcs` functions)
/// into `OUT_DIR`, from the pseudo-random stream seeded with `seed`
/// (non-zero). Also tells cargo to rerun when this file changes.
pub fn generate(data_len: usize, funcs: usize, seed: u64) {
    // Relative to the including crate's manifest dir, which is where cargo
    // runs build scripts; every sized crate is a sibling of `big`.
    println!("cargo:rerun-if-changed=../big/payload_gen.rs");
    println!("cargo:rerun-if-changed=build.rs");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));

    let mut rng = XorShift(seed);
    let mut data = Vec::with_capacity(data_len);
    while data.len() < data_len {
        data.extend_from_slice(&rng.next().to_le_bytes());
    }
    data.truncate(data_len);
    fs::write(out.join("data.bin"), &data).expect("write data.bin");

    fs::write(out.join("gen.rs"), functions(&mut rng, funcs)).expect("write gen.rs");
}

/// The source of `funcs` generated functions `gen_<i>` and the table
/// `GENERATED` of all of them.
fn functions(rng: &mut XorShift, funcs: usize) -> String {
    const FMT: &str = "formatting into a String cannot fail";
    let mut code = String::new();
    for i in 0..funcs {
        let (a, b, c) = (rng.next() | 1, rng.next(), rng.next() | 1);
        let (r1, r2) = (rng.next() % 63 + 1, rng.next() % 63 + 1);
        let rounds = 4 + rng.next() % 5;
        writeln!(code, "#[inline(never)]\nfn gen_{i}(x: u64) -> u64 {{").expect(FMT);
        writeln!(code, "    let mut h = x ^ {b:#x};").expect(FMT);
        // Straight-line rounds (no loop), so every function is real code.
        for r in 0..rounds {
            let k = rng.next() | 1;
            writeln!(code, "    h = h.wrapping_mul({a:#x}).rotate_left({r1});").expect(FMT);
            writeln!(code, "    h ^= h >> {r2};").expect(FMT);
            writeln!(
                code,
                "    h = h.wrapping_add({c:#x} ^ {k:#x}).rotate_right({});",
                (r + 1) % 64
            )
            .expect(FMT);
        }
        writeln!(code, "    h\n}}").expect(FMT);
    }
    writeln!(code, "/// Every generated function, indexable at run time.").expect(FMT);
    writeln!(code, "static GENERATED: [fn(u64) -> u64; {funcs}] = [").expect(FMT);
    for i in 0..funcs {
        writeln!(code, "    gen_{i},").expect(FMT);
    }
    writeln!(code, "];").expect(FMT);
    code
}
