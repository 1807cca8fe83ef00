//! The nested cargo build of a guest workspace for `wasm32-wasip2`, shared
//! by everything that compiles guests into components: the sample Workers'
//! build script (`sample-workers/build.rs`) and `cargo xtask engine`, which
//! rebuilds the prebuilt JS engine.
//!
//! [`build`] makes sure the active toolchain has the `wasm32-wasip2`
//! standard library (installing it with `rustup target add` if not:
//! `RUSTUP_AUTO_INSTALL=0` means `rust-toolchain.toml`'s `targets` is not
//! acted on by itself), then runs `cargo build --release --target
//! wasm32-wasip2` of the guest workspace with its own stable target dir (so
//! rebuilds are incremental) and with the outer cargo's environment that
//! would leak into or break the nested build removed.

use std::env;
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::Error;

/// The guest target.
pub const TARGET: &str = "wasm32-wasip2";

/// Builds the guest workspace in `dir` (its `Cargo.toml`) for [`TARGET`]
/// into `target_dir`, with `envs` set for the nested cargo (after the outer
/// cargo's variables are removed).
pub fn build(dir: &Path, target_dir: &Path, envs: &[(&str, &OsString)]) -> Result<(), Error> {
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| OsString::from("rustc"));
    ensure_target(&rustc)?;

    let cargo = env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut cmd = Command::new(&cargo);
    cmd.arg("build")
        .arg("--release")
        .arg("--target")
        .arg(TARGET)
        .arg("--manifest-path")
        .arg(dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir)
        .current_dir(dir);
    sanitize_env(&mut cmd);
    for (key, value) in envs {
        cmd.env(key, value);
    }
    // The build script's stdout is parsed by cargo for `cargo:` directives;
    // the nested build's output goes to stderr (shown with `-vv` or on failure).
    cmd.stdout(Stdio::from(io::stderr()));
    eprintln!("running: {cmd:?}");
    let status = cmd
        .status()
        .map_err(|e| format!("could not run {}: {e}", Path::new(&cargo).display()))?;
    if !status.success() {
        return Err(format!(
            "the nested guest build failed ({status}); run it by hand to see why:\n  \
             cd {} && cargo build --release --target {TARGET}",
            dir.display()
        )
        .into());
    }
    Ok(())
}

/// The environment variable `name`, which cargo sets for a build script.
pub fn env_var(name: &str) -> Result<OsString, Error> {
    env::var_os(name).ok_or_else(|| Error::new(format!("{name} is not set (not run by cargo?)")))
}

/// Makes sure the standard library for [`TARGET`] is installed in the sysroot
/// of `rustc` (the compiler cargo uses here, and so the nested build too),
/// installing it with rustup if missing.
pub fn ensure_target(rustc: &OsString) -> Result<(), Error> {
    let sysroot = sysroot(rustc)?;
    let target_lib = sysroot.join("lib").join("rustlib").join(TARGET);
    if target_lib.join("lib").is_dir() {
        return Ok(());
    }
    // The rustup proxy sets RUSTUP_TOOLCHAIN for the processes it starts; a
    // rustup toolchain's sysroot is also named after the toolchain.
    let toolchain = env::var("RUSTUP_TOOLCHAIN").ok().or_else(|| {
        sysroot
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_owned)
    });
    let hint = match &toolchain {
        Some(t) => format!("rustup target add {TARGET} --toolchain {t}"),
        None => format!("rustup target add {TARGET}"),
    };
    println!(
        "cargo:warning=the {TARGET} target is not installed in {}; running `{hint}`",
        sysroot.display()
    );
    let mut cmd = Command::new("rustup");
    cmd.arg("target").arg("add").arg(TARGET);
    if let Some(t) = &toolchain {
        cmd.arg("--toolchain").arg(t);
    }
    cmd.stdout(Stdio::from(io::stderr()));
    let installed = match cmd.status() {
        Ok(status) => status.success(),
        Err(e) => {
            eprintln!("could not run rustup: {e}");
            false
        }
    };
    if installed && target_lib.join("lib").is_dir() {
        return Ok(());
    }
    Err(format!(
        "the Rust standard library for {TARGET} is not installed in {} and installing it \
         failed. Install it with:\n  {hint}\nthen build again.",
        sysroot.display()
    )
    .into())
}

fn sysroot(rustc: &OsString) -> Result<PathBuf, Error> {
    let output = Command::new(rustc)
        .arg("--print")
        .arg("sysroot")
        .output()
        .map_err(|e| format!("could not run {}: {e}", Path::new(rustc).display()))?;
    if !output.status.success() {
        return Err(format!(
            "`{} --print sysroot` failed: {}",
            Path::new(rustc).display(),
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    let text = String::from_utf8(output.stdout).map_err(|e| format!("sysroot not UTF-8: {e}"))?;
    Ok(PathBuf::from(text.trim()))
}

/// Removes from the nested cargo's environment everything the outer cargo set
/// for this build script (or inherited) that would change or break the guest
/// build: target dir, target triple, rustflags, profile overrides, wrappers
/// (clippy's `RUSTC_WORKSPACE_WRAPPER`), the jobserver, and every per-package
/// variable (`CARGO_PKG_*`, `CARGO_CFG_*`, `CARGO_FEATURE_*`, ...). Keeps
/// `CARGO_HOME` and network/registry/terminal settings.
fn sanitize_env(cmd: &mut Command) {
    const KEEP_PREFIXES: &[&str] = &[
        "CARGO_HOME",
        "CARGO_BUILD_JOBS",
        "CARGO_NET_",
        "CARGO_HTTP_",
        "CARGO_REGISTRIES_",
        "CARGO_REGISTRY_",
        "CARGO_TERM_",
        "CARGO_LOG",
    ];
    const REMOVE: &[&str] = &[
        "RUSTFLAGS",
        "RUSTDOCFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_BOOTSTRAP",
        "MAKEFLAGS",
        "MFLAGS",
        "TARGET",
        "HOST",
        "OUT_DIR",
        "OPT_LEVEL",
        "PROFILE",
        "DEBUG",
        "NUM_JOBS",
        "RUSTC_LINKER",
        "__CARGO_FIX_PLZ",
    ];
    for (key, _) in env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        let cargo_var =
            key.starts_with("CARGO_") && !KEEP_PREFIXES.iter().any(|p| key.starts_with(p));
        if cargo_var || key.starts_with("__CARGO") || REMOVE.contains(&key) {
            cmd.env_remove(key);
        }
    }
}
