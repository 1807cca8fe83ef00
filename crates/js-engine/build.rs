//! Builds hearth's JS engine, the guest component in `sdk/js/engine`
//! (QuickJS-NG through rquickjs), for `wasm32-wasip2` with a nested cargo
//! ([`nested_cargo`], shared with the sample Workers' build), and copies it
//! to `$OUT_DIR/engine.wasm` for `src/lib.rs` to embed.
//!
//! rquickjs-sys compiles QuickJS's C sources with the `cc` crate. It would
//! download wasi-sdk from GitHub; instead (`RQUICKJS_SYS_NO_WASI_SDK=1`)
//! the system's clang and wasi-libc are used (Debian: `apt-get install -y
//! clang wasi-libc llvm`). Debian's clang 14 does not know the
//! `wasm32-wasip2` triple `cc` passes, so `CC_wasm32_wasip2` is a wrapper
//! (written into the guest's target dir, a stable path) that appends
//! `--target=wasm32-wasi` (the last `--target` wins); `AR_wasm32_wasip2` is
//! `llvm-ar` (or a versioned `llvm-ar-NN`). A probe compile checks the
//! three are there before the nested build starts, so a missing package is
//! named instead of a C compiler error deep in the build.

use std::env;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "../../sample-workers/nested_cargo.rs"]
mod nested_cargo;

use nested_cargo::{TARGET, copy_if_changed, env_var, write_if_changed};

/// What to install when the C toolchain for the guest is missing.
const INSTALL: &str = "apt-get install -y clang wasi-libc llvm";

/// The guest's component, in its target dir.
const ARTIFACT: &str = "hearth_js_engine_guest.wasm";

fn main() {
    if let Err(e) = run() {
        panic!("hearth-js-engine build script failed: {e}");
    }
}

fn run() -> Result<(), String> {
    let manifest_dir = PathBuf::from(env_var("CARGO_MANIFEST_DIR")?);
    let out_dir = PathBuf::from(env_var("OUT_DIR")?);
    let root = manifest_dir.join("..").join("..");
    let guest = root.join("sdk").join("js").join("engine");
    let guest_target = guest.join("target");

    rerun_if_changed(&root, &guest);

    let clang = find_tool("clang")?;
    let ar = find_tool("llvm-ar")?;
    fs::create_dir_all(&guest_target)
        .map_err(|e| format!("creating {}: {e}", guest_target.display()))?;
    let cc = guest_target.join("hearth-cc-wasm32-wasi.sh");
    write_wrapper(&cc, &clang)?;
    probe(&cc, &out_dir)?;

    let no_sdk = OsString::from("1");
    let cc = cc.into_os_string();
    let ar = ar.into_os_string();
    nested_cargo::build(
        &guest,
        &guest_target,
        &[
            ("RQUICKJS_SYS_NO_WASI_SDK", &no_sdk),
            ("CC_wasm32_wasip2", &cc),
            ("AR_wasm32_wasip2", &ar),
        ],
    )?;
    let built = guest_target.join(TARGET).join("release").join(ARTIFACT);
    copy_if_changed(&built, &out_dir.join("engine.wasm"))
}

/// Tells cargo to rerun this script when the guest's sources, manifest,
/// lock file or WIT change, or hearth-sdk's (a path dependency of the
/// guest); never watching the guest's target dir.
fn rerun_if_changed(root: &Path, guest: &Path) {
    println!("cargo:rerun-if-changed=build.rs");
    let shared = root.join("sample-workers").join("nested_cargo.rs");
    println!("cargo:rerun-if-changed={}", shared.display());
    for item in ["src", "Cargo.toml", "Cargo.lock", "wit"] {
        println!("cargo:rerun-if-changed={}", guest.join(item).display());
    }
    for item in ["src", "Cargo.toml"] {
        println!(
            "cargo:rerun-if-changed={}",
            root.join("sdk").join(item).display()
        );
    }
    println!("cargo:rerun-if-env-changed=RUSTUP_TOOLCHAIN");
}

/// `name` on PATH, or else its highest versioned form (`llvm-ar-14`,
/// `clang-19`, ...), as Debian installs them.
fn find_tool(name: &str) -> Result<PathBuf, String> {
    let path = env::var_os("PATH").unwrap_or_default();
    let mut versioned: Option<(u32, PathBuf)> = None;
    for dir in env::split_paths(&path) {
        let exact = dir.join(name);
        if exact.is_file() {
            return Ok(exact);
        }
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let file = entry.file_name();
            let Some(version) = file
                .to_str()
                .and_then(|f| f.strip_prefix(name))
                .and_then(|f| f.strip_prefix('-'))
                .and_then(|v| v.parse::<u32>().ok())
            else {
                continue;
            };
            if versioned.as_ref().is_none_or(|(best, _)| version > *best) {
                versioned = Some((version, entry.path()));
            }
        }
    }
    versioned.map(|(_, path)| path).ok_or_else(|| {
        format!(
            "`{name}` is not on PATH: building hearth's JS engine (QuickJS, C) for \
             {TARGET} needs clang, wasi-libc and llvm-ar; on Debian or Ubuntu: {INSTALL}"
        )
    })
}

/// Writes the compiler wrapper `cc` for `clang` (see the module docs).
fn write_wrapper(cc: &Path, clang: &Path) -> Result<(), String> {
    let clang = clang
        .to_str()
        .ok_or_else(|| format!("non-UTF-8 path {}", clang.display()))?;
    let script = format!(
        "#!/bin/sh\n# Written by crates/js-engine/build.rs: clang for wasm32-wasip2 \
         (wasi-libc's triple is wasm32-wasi).\nexec '{clang}' \"$@\" --target=wasm32-wasi\n"
    );
    write_if_changed(cc, script.as_bytes())?;
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(cc, fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("making {} executable: {e}", cc.display()))
}

/// Compiles a C file that includes libc headers with `cc`, so a missing
/// wasi-libc is reported with the package to install.
fn probe(cc: &Path, out_dir: &Path) -> Result<(), String> {
    let source = out_dir.join("probe.c");
    fs::write(
        &source,
        "#include <stdlib.h>\n#include <string.h>\nint probe(void) { return (int)strlen(getenv(\"x\")); }\n",
    )
    .map_err(|e| format!("writing {}: {e}", source.display()))?;
    let output = Command::new(cc)
        .arg("-c")
        .arg(&source)
        .arg("-o")
        .arg(out_dir.join("probe.o"))
        .output()
        .map_err(|e| format!("could not run {}: {e}", cc.display()))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "clang cannot compile C for wasm32-wasi here (is wasi-libc installed?): building \
         hearth's JS engine (QuickJS, C) needs clang, wasi-libc and llvm-ar; on Debian or \
         Ubuntu: {INSTALL}\nclang said:\n{}",
        String::from_utf8_lossy(&output.stderr)
    ))
}
