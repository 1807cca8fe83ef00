//! Builds hearth's sample Workers from source into wasi:http proxy components.
//!
//! Steps:
//! 1. Make sure the active toolchain has the `wasm32-wasip2` standard library
//!    and run a nested `cargo build --release --target wasm32-wasip2` of the
//!    guest workspace `workers/`, with its own stable target dir
//!    `workers/target` (`hearth_build_support::nested`, shared with
//!    `cargo xtask engine`).
//! 2. Build the JS and Python samples with their own toolchains. Python is
//!    optional: on a machine without `python3` and its `venv` module the
//!    sample is skipped with a warning (its tests say so and pass), unless
//!    `HEARTH_REQUIRE_PYTHON=1` (CI) makes that an error.
//! 3. Copy each component to `workers/target/hearth-samples/<name>.wasm` and
//!    write `$OUT_DIR/paths.rs` (the names and absolute paths) for `src/lib.rs`.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use hearth_build_support::Error;
use hearth_build_support::files::{Digest, copy_if_changed, write_if_changed};
use hearth_build_support::nested::{self, TARGET, env_var};

/// The sample Workers: each is the crate `workers/<name>`, whose component is
/// `<name with - as _>.wasm` in the guest target dir.
const WORKERS: &[&str] = &[
    "hello",
    "echo",
    "big",
    "size-1m",
    "size-10m",
    "slow-start",
    "cpu-hog",
    "mem-hog",
    "trap",
    "wstd-hello",
    "relay",
    "dispatcher",
    "user-app",
    "egress",
    "tail-log",
    "chatty",
    "body-hog",
    "fan-out",
    "fetcher",
    "config-echo",
    "counter",
];

/// A sample Worker in another language, built by its own toolchain.
struct Foreign {
    /// The sample's name (`<name>.wasm`).
    name: &'static str,
    /// Its directory under `sample-workers/`.
    dir: &'static str,
    /// The files and directories (relative to `dir`) that decide the output;
    /// `../wit` is the WIT both foreign samples share.
    inputs: &'static [&'static str],
    /// The build command: program and arguments; the output path is
    /// appended.
    command: &'static [&'static str],
    /// A command that succeeds when the toolchain is there, and what to
    /// install if it does not.
    needs: (&'static [&'static str], &'static str),
    /// For a sample that is skipped where its toolchain is missing: the
    /// environment variable that, set to `1`, makes it required instead.
    optional: Option<&'static str>,
}

/// The JavaScript (componentize-js, a fetch-event Worker) and Python
/// (componentize-py) samples.
/// Each build script installs its pinned toolchain itself (`npm ci`, a pip
/// venv in the user's cache); only Node.js or Python must be present.
const FOREIGN: &[Foreign] = &[
    Foreign {
        name: "js",
        dir: "js",
        inputs: &[
            "worker.js",
            "build.mjs",
            "package.json",
            "package-lock.json",
            "../wit",
        ],
        command: &["node", "build.mjs"],
        needs: (
            &["node", "--version"],
            "Node.js 18 or newer with npm (e.g. apt-get install -y nodejs npm)",
        ),
        optional: None,
    },
    Foreign {
        name: "python",
        dir: "python",
        inputs: &["app.py", "build.sh", "../wit"],
        command: &["bash", "build.sh"],
        needs: (
            &["python3", "-c", "import venv, ensurepip"],
            "Python 3.9 or newer with venv and pip (e.g. apt-get install -y python3-venv python3-pip)",
        ),
        optional: Some("HEARTH_REQUIRE_PYTHON"),
    },
];

fn main() {
    if let Err(e) = run() {
        panic!("hearth-sample-workers build script failed: {e}");
    }
}

/// What becomes of a foreign sample.
enum Outcome {
    /// Its toolchain is there: built (or up to date).
    Built,
    /// Skipped: its toolchain is missing and it is optional; why.
    Skipped(String),
}

fn run() -> Result<(), Error> {
    let manifest_dir = PathBuf::from(env_var("CARGO_MANIFEST_DIR")?);
    let out_dir = PathBuf::from(env_var("OUT_DIR")?);
    let workers_dir = manifest_dir.join("workers");
    let sdk_dir = manifest_dir.join("..").join("sdk");
    let guest_target = workers_dir.join("target");
    let samples_dir = guest_target.join("hearth-samples");

    rerun_if_changed(&workers_dir, &sdk_dir)?;
    let toolchains = FOREIGN
        .iter()
        .map(toolchain)
        .collect::<Result<Vec<_>, _>>()?;

    nested::build(&workers_dir, &guest_target, &[])?;

    fs::create_dir_all(&samples_dir)
        .map_err(|e| format!("creating {}: {e}", samples_dir.display()))?;
    let built = guest_target.join(TARGET).join("release");
    let mut entries = Vec::new();
    for name in WORKERS {
        let artifact = built.join(format!("{}.wasm", name.replace('-', "_")));
        let dest = samples_dir.join(format!("{name}.wasm"));
        copy_if_changed(&artifact, &dest)?;
        // Rebuild if a copied component is deleted or replaced.
        println!("cargo:rerun-if-changed={}", dest.display());
        entries.push((*name, dest));
    }

    let mut skipped = Vec::new();
    for (guest, toolchain) in FOREIGN.iter().zip(toolchains) {
        let dest = samples_dir.join(format!("{}.wasm", guest.name));
        match toolchain {
            Outcome::Built => {
                build_foreign(guest, &manifest_dir.join(guest.dir), &dest)?;
                println!("cargo:rerun-if-changed={}", dest.display());
                entries.push((guest.name, dest));
            }
            Outcome::Skipped(why) => {
                println!("cargo:warning={why}");
                skipped.push((guest.name, why));
            }
        }
    }

    let mut code = String::new();
    code.push_str("/// Names of the sample Workers, in a fixed order.\n");
    code.push_str("pub const NAMES: &[&str] = &[\n");
    for (name, _) in &entries {
        code.push_str(&format!("    {name:?},\n"));
    }
    code.push_str("];\n\n");
    code.push_str("/// (name, absolute path of the component) for each sample Worker.\n");
    code.push_str("const PATHS: &[(&str, &str)] = &[\n");
    for (name, path) in &entries {
        let path = path
            .to_str()
            .ok_or_else(|| format!("non-UTF-8 path {}", path.display()))?;
        code.push_str(&format!("    ({name:?}, {path:?}),\n"));
    }
    code.push_str("];\n\n");
    code.push_str("/// (name, why) for each sample Worker this build skipped.\n");
    code.push_str("const SKIPPED: &[(&str, &str)] = &[\n");
    for (name, why) in &skipped {
        code.push_str(&format!("    ({name:?}, {why:?}),\n"));
    }
    code.push_str("];\n\n");
    let dir = samples_dir
        .to_str()
        .ok_or_else(|| format!("non-UTF-8 path {}", samples_dir.display()))?;
    code.push_str("/// Absolute path of the directory holding every sample component.\n");
    code.push_str(&format!("const DIR: &str = {dir:?};\n"));
    write_if_changed(&out_dir.join("paths.rs"), code.as_bytes())?;
    Ok(())
}

/// Tells cargo to rerun this script when a guest source, manifest, lock file
/// or the SDK changes (never watching `workers/target`).
fn rerun_if_changed(workers_dir: &Path, sdk_dir: &Path) -> Result<(), Error> {
    println!("cargo:rerun-if-changed=build.rs");
    for file in ["Cargo.toml", "Cargo.lock"] {
        println!(
            "cargo:rerun-if-changed={}",
            workers_dir.join(file).display()
        );
    }
    for name in WORKERS {
        let dir = workers_dir.join(name);
        if !dir.is_dir() {
            return Err(format!("missing guest crate {}", dir.display()).into());
        }
        // The whole crate directory (sources, manifest, build script, and
        // any file added later); the guest target dir is outside it.
        println!("cargo:rerun-if-changed={}", dir.display());
    }
    // Not the whole sdk/ (it may hold its own target/ when built alone).
    // Only existing paths: cargo reruns every time for a missing one.
    for item in ["Cargo.toml", "src", "wit"] {
        let path = sdk_dir.join(item);
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    // Also toolchain choice, which decides the compiler for the guests.
    println!("cargo:rerun-if-env-changed=RUSTUP_TOOLCHAIN");
    Ok(())
}

/// Builds the foreign sample `guest` (sources in `dir`) into `dest`, unless
/// `dest` was built from the same inputs (a blake3 of them is kept beside
/// it: these builds take tens of seconds and run only when an input
/// changes).
fn build_foreign(guest: &Foreign, dir: &Path, dest: &Path) -> Result<(), Error> {
    let mut digest = Digest::new(dir);
    for input in guest.inputs {
        println!("cargo:rerun-if-changed={}", dir.join(input).display());
        digest.add(input)?;
    }
    let digest = digest.hex();
    let stamp = dest.with_extension("inputs");
    if dest.is_file() && fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == digest) {
        return Ok(());
    }
    let tmp = dest.with_extension(format!("tmp{}.wasm", std::process::id()));
    let mut cmd = Command::new(guest.command[0]);
    cmd.args(&guest.command[1..]).arg(&tmp).current_dir(dir);
    cmd.stdout(Stdio::from(io::stderr()));
    eprintln!("running: {cmd:?}");
    let status = cmd
        .status()
        .map_err(|e| format!("could not run {}: {e}", guest.command[0]))?;
    if !status.success() {
        let _ = fs::remove_file(&tmp);
        return Err(format!(
            "building the {} sample Worker failed ({status}); run it by hand to see why:\n  \
             cd {} && {} OUT.wasm",
            guest.name,
            dir.display(),
            guest.command.join(" ")
        )
        .into());
    }
    fs::rename(&tmp, dest).map_err(|e| format!("renaming into {}: {e}", dest.display()))?;
    fs::write(&stamp, &digest).map_err(|e| format!("writing {}: {e}", stamp.display()))?;
    Ok(())
}

/// Checks that `guest`'s toolchain is there, before any build starts (so a
/// missing one is named in the build's first seconds, not after the Rust
/// guests compiled): `Built` when it is, `Skipped` for an optional sample
/// without one, an error naming what to install for a required one.
fn toolchain(guest: &Foreign) -> Result<Outcome, Error> {
    let (probe, install) = guest.needs;
    let present = Command::new(probe[0])
        .args(&probe[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if present {
        return Ok(Outcome::Built);
    }
    let why = format!(
        "building the {} sample Worker needs `{}`, which failed or is not on PATH: install {install}",
        guest.name,
        probe.join(" ")
    );
    if let Some(require) = guest.optional {
        println!("cargo:rerun-if-env-changed={require}");
        if std::env::var(require).as_deref() != Ok("1") {
            return Ok(Outcome::Skipped(format!(
                "{why} (skipped, with the tests that use it; {require}=1 makes it required)"
            )));
        }
    }
    Err(why.into())
}
