//! The `hearth` crate's integration tests, as one test binary.
//!
//! Each file under `tests/` used to be its own binary, and each of those
//! linked wasmtime and the whole crate (~30-60 s of CI apiece) and then ran
//! alone: `cargo test` runs test binaries one after another, so a binary whose
//! few slow tests ran one at a time left the other core idle. One binary is
//! linked once, and the test harness runs all of these tests side by side on
//! every core.
//!
//! Every test therefore shares its process with the others: it must not set
//! process-wide state (environment variables, the working directory, signal
//! handlers, rlimits; start a child process for those), bind fixed ports (the
//! docs' console examples alone use 8000-9999, one document at a time: see
//! `docs.rs`), or
//! count the process's own threads, files or children. Each module is one
//! former file, named as before; run one with
//! `cargo test --release --test it serve::` (or one test with
//! `--test it serve::two_nodes`).

mod admin;
mod bench;
mod cluster;
mod demo;
mod deploy_manifests;
mod dev;
mod docs;
mod egress;
mod env;
mod front_door;
mod fuzz_front_door;
mod fuzz_parsers;
mod hostile;
mod http2;
mod https;
mod js_build;
mod js_engine;
mod js_loop;
mod js_objects;
mod js_web;
mod js_web_inputs;
mod loops;
mod nested;
mod object_alarms;
mod object_limits;
mod objects;
mod objects_cluster;
mod otlp;
mod redirects;
mod rolling_upgrade;
mod routes;
mod s3;
mod serve;
mod tail;
mod tail_bounds;
mod unknown_names;
mod versions;

/// The `hearth` binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_hearth");

/// The `hearth` binary under test, for the process harness
/// (`hearth::testing::NodeProcess` and the commands a user types).
fn hearth() -> hearth::testing::Hearth {
    hearth::testing::Hearth::new(BIN)
}

/// A port on 127.0.0.1 that was free a moment ago.
fn free_port() -> u16 {
    hearth::testing::tcp_port().expect("a free port")
}
