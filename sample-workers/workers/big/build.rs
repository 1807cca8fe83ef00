//! Generates the `big` Worker's payload into `OUT_DIR`:
//!
//! - `data.bin`: [`DATA_LEN`] bytes of xorshift64* output, i.e. incompressible
//!   (gzip cannot shrink it), so the component's compressed size is real;
//! - `gen.rs`: [`FUNCS`] distinct generated straight-line functions and a
//!   table of them, so the component also has a lot of real code (and a
//!   non-trivial compile time for the host's Cranelift, not just for rustc).
//!
//! Both are deterministic (fixed seed), so builds are reproducible.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::PathBuf;

/// 5.5 MiB of data: with the code, gzip size ~5.6 MiB (between 3 and 10 MiB).
const DATA_LEN: usize = 5 * 1024 * 1024 + 512 * 1024;
/// Number of generated functions.
const FUNCS: usize = 4096;

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));

    let mut rng = XorShift(0x6865_6172_7468_2121); // "hearth!!"
    let mut data = Vec::with_capacity(DATA_LEN);
    while data.len() < DATA_LEN {
        data.extend_from_slice(&rng.next().to_le_bytes());
    }
    data.truncate(DATA_LEN);
    fs::write(out.join("data.bin"), &data).expect("write data.bin");

    let mut code = String::new();
    for i in 0..FUNCS {
        let (a, b, c) = (rng.next() | 1, rng.next(), rng.next() | 1);
        let (r1, r2) = (rng.next() % 63 + 1, rng.next() % 63 + 1);
        let rounds = 4 + rng.next() % 5;
        writeln!(code, "#[inline(never)]\nfn gen_{i}(x: u64) -> u64 {{").unwrap();
        writeln!(code, "    let mut h = x ^ {b:#x};").unwrap();
        // Straight-line rounds (no loop), so every function is real code.
        for r in 0..rounds {
            let k = rng.next() | 1;
            writeln!(code, "    h = h.wrapping_mul({a:#x}).rotate_left({r1});").unwrap();
            writeln!(code, "    h ^= h >> {r2};").unwrap();
            writeln!(
                code,
                "    h = h.wrapping_add({c:#x} ^ {k:#x}).rotate_right({});",
                (r + 1) % 64
            )
            .unwrap();
        }
        writeln!(code, "    h\n}}").unwrap();
    }
    writeln!(code, "/// Every generated function, indexable at run time.").unwrap();
    writeln!(code, "static GENERATED: [fn(u64) -> u64; {FUNCS}] = [").unwrap();
    for i in 0..FUNCS {
        writeln!(code, "    gen_{i},").unwrap();
    }
    writeln!(code, "];").unwrap();
    fs::write(out.join("gen.rs"), code).expect("write gen.rs");
}
