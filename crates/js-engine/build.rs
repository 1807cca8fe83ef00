//! Checks that the committed engine (`prebuilt/engine.wasm`, embedded by
//! `src/lib.rs`) was built from today's sources, before anything else of
//! this crate compiles.
//!
//! The engine (the guest in `sdk/js/engine`: QuickJS-NG, C, through
//! rquickjs) is not compiled here: that needs a C toolchain for wasm32-wasi
//! that rustup cannot install, so it ships prebuilt with a stamp of its
//! sources (`hearth_build_support::engine`). When a contributor has changed
//! the sources, this script stops the build at once with the command that
//! rebuilds the engine (`cargo xtask engine`), instead of embedding a stale
//! one.

use std::path::PathBuf;
use std::process::ExitCode;

use hearth_build_support::engine;

fn main() -> ExitCode {
    // Read when the script runs, not baked in when it compiles: cargo shares
    // this script's binary between checkouts of the repository that use one
    // target directory, and each must check its own sources.
    let Some(manifest_dir) = std::env::var_os("CARGO_MANIFEST_DIR") else {
        eprintln!("error: cargo did not set CARGO_MANIFEST_DIR");
        return ExitCode::FAILURE;
    };
    let root = PathBuf::from(manifest_dir).join("..").join("..");
    println!("cargo:rerun-if-changed=build.rs");
    for input in engine::INPUTS
        .iter()
        .chain([&engine::WASM, &engine::SOURCES])
    {
        println!("cargo:rerun-if-changed={}", root.join(input).display());
    }
    match engine::check(&root) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
