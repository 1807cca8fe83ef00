//! `cargo xtask <task>`: hearth's maintenance commands (the alias is in
//! `.cargo/config.toml`).
//!
//! * `cargo xtask engine` rebuilds hearth's JS engine (the guest component
//!   in `sdk/js/engine`, QuickJS-NG through rquickjs) for `wasm32-wasip2`
//!   and rewrites the committed `crates/js-engine/prebuilt/engine.wasm` and
//!   its stamp `engine.sources` (see `hearth_build_support::engine`). It
//!   needs a C toolchain for wasm32-wasi: clang, wasi-libc and llvm-ar
//!   (Debian or Ubuntu: `apt-get install -y clang wasi-libc llvm`).
//! * `cargo xtask engine --check` only checks that the committed engine
//!   matches today's sources (what every build of `hearth-js-engine` does).
//!
//! rquickjs-sys compiles QuickJS's C sources with the `cc` crate. It would
//! download wasi-sdk from GitHub; instead (`RQUICKJS_SYS_NO_WASI_SDK=1`) the
//! system's clang and wasi-libc are used. Debian's clang 14 does not know
//! the `wasm32-wasip2` triple `cc` passes, so `CC_wasm32_wasip2` is a
//! wrapper (written into the guest's target dir) that appends
//! `--target=wasm32-wasi` (the last `--target` wins); `AR_wasm32_wasip2` is
//! `llvm-ar` (or a versioned `llvm-ar-NN`). A probe compile checks the three
//! are there before the nested build starts, so a missing package is named
//! instead of a C compiler error deep in the build.

use std::env;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use hearth_build_support::engine::{self, INSTALL, Stamp};
use hearth_build_support::files::write_if_changed;
use hearth_build_support::{Error, nested};

/// The guest's component, in its target dir.
const ARTIFACT: &str = "hearth_js_engine_guest.wasm";

const USAGE: &str = "usage: cargo xtask engine [--check]\n\n  \
    engine          rebuild the prebuilt JS engine (needs clang, wasi-libc, llvm-ar)\n  \
    engine --check  check that the committed engine matches its sources";

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match args.as_slice() {
        ["engine"] => rebuild_engine(&root()),
        ["engine", "--check"] => engine::check(&root()).map(|()| {
            println!("{} matches its sources", engine::WASM);
        }),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The repository root (this crate is `xtask/` in it): from the
/// `CARGO_MANIFEST_DIR` that `cargo run` sets, so a binary shared between
/// checkouts (one `CARGO_TARGET_DIR` for several worktrees) works on the
/// checkout it is run from, not the one it was compiled in.
fn root() -> PathBuf {
    let manifest = env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    let root = manifest.join("..");
    root.canonicalize().unwrap_or(root)
}

/// Builds the engine with clang and rewrites the prebuilt component and its
/// stamp.
fn rebuild_engine(root: &Path) -> Result<(), Error> {
    let guest = root.join("sdk").join("js").join("engine");
    let guest_target = guest.join("target");
    let clang = find_tool("clang")?;
    let ar = find_tool("llvm-ar")?;
    fs::create_dir_all(&guest_target)
        .map_err(|e| format!("creating {}: {e}", guest_target.display()))?;
    let cc = guest_target.join("hearth-cc-wasm32-wasi.sh");
    write_wrapper(&cc, &clang)?;
    probe(&cc, &guest_target)?;

    let sources = engine::sources_digest(root)?;
    let no_sdk = OsString::from("1");
    let cc = cc.into_os_string();
    let ar = ar.into_os_string();
    nested::build(
        &guest,
        &guest_target,
        &[
            ("RQUICKJS_SYS_NO_WASI_SDK", &no_sdk),
            ("CC_wasm32_wasip2", &cc),
            ("AR_wasm32_wasip2", &ar),
        ],
    )?;
    if engine::sources_digest(root)? != sources {
        return Err(Error::new(
            "the engine's sources changed while it was being built: run it again",
        ));
    }
    let built = guest_target
        .join(nested::TARGET)
        .join("release")
        .join(ARTIFACT);
    let wasm = fs::read(&built).map_err(|e| format!("reading {}: {e}", built.display()))?;
    let stamp = Stamp {
        sources,
        wasm: engine::wasm_digest(&wasm),
    };
    let wasm_path = root.join(engine::WASM);
    if let Some(dir) = wasm_path.parent() {
        fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    write_if_changed(&wasm_path, &wasm)?;
    write_if_changed(&root.join(engine::SOURCES), stamp.render().as_bytes())?;
    println!(
        "wrote {} ({} bytes) and {}: commit both",
        engine::WASM,
        wasm.len(),
        engine::SOURCES
    );
    Ok(())
}

/// `name` on PATH, or else its highest versioned form (`llvm-ar-14`,
/// `clang-19`, ...), as Debian installs them.
fn find_tool(name: &str) -> Result<PathBuf, Error> {
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
        Error::new(format!(
            "`{name}` is not on PATH: building hearth's JS engine (QuickJS, C) for {} needs \
             clang, wasi-libc and llvm-ar; on Debian or Ubuntu: {INSTALL}",
            nested::TARGET
        ))
    })
}

/// Writes the compiler wrapper `cc` for `clang` (see the module docs).
fn write_wrapper(cc: &Path, clang: &Path) -> Result<(), Error> {
    let clang = clang
        .to_str()
        .ok_or_else(|| format!("non-UTF-8 path {}", clang.display()))?;
    let script = format!(
        "#!/bin/sh\n# Written by `cargo xtask engine`: clang for wasm32-wasip2 \
         (wasi-libc's triple is wasm32-wasi).\nexec '{clang}' \"$@\" --target=wasm32-wasi\n"
    );
    write_if_changed(cc, script.as_bytes())?;
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(cc, fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("making {} executable: {e}", cc.display()).into())
}

/// Compiles a C file that includes libc headers with `cc`, so a missing
/// wasi-libc is reported with the package to install.
fn probe(cc: &Path, dir: &Path) -> Result<(), Error> {
    let source = dir.join("probe.c");
    fs::write(
        &source,
        "#include <stdlib.h>\n#include <string.h>\nint probe(void) { return (int)strlen(getenv(\"x\")); }\n",
    )
    .map_err(|e| format!("writing {}: {e}", source.display()))?;
    let output = Command::new(cc)
        .arg("-c")
        .arg(&source)
        .arg("-o")
        .arg(dir.join("probe.o"))
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
    )
    .into())
}
