//! The JS engine ships prebuilt, tied to its sources by a digest.
//!
//! hearth's JS engine is a guest component (`sdk/js/engine`: Rust around
//! QuickJS-NG, which is C). Compiling C for `wasm32-wasi` needs clang,
//! wasi-libc and llvm-ar, which rustup cannot install; a user who builds
//! hearth never changes the engine. So the engine is committed, built, at
//! [`WASM`], with [`SOURCES`] beside it: a [`Stamp`] holding the digest of
//! every input the engine is built from ([`INPUTS`]) and of the component.
//!
//! * `crates/js-engine/build.rs` runs [`check`] on every build: when the
//!   sources are the ones the component was built from, the build embeds
//!   it; when they changed, the build stops at once with [`REBUILD`], so a
//!   contributor who edits the engine never gets a stale one.
//! * `cargo xtask engine` ([`REBUILD`]) compiles the engine with clang and
//!   rewrites both files; the contributor commits them with the change.
//!
//! CI builds with the same check, so a commit whose engine does not match
//! its sources cannot pass.

use std::fs;
use std::path::Path;

use crate::Error;
use crate::files::Digest;

/// Everything the engine component is built from, relative to the
/// repository root: the guest crate (its WIT reaches the shared WASI WIT
/// through symbolic links, followed), hearth-sdk (a path dependency of the
/// guest) and the toolchain that compiles them.
pub const INPUTS: &[&str] = &[
    "sdk/js/engine/Cargo.toml",
    "sdk/js/engine/Cargo.lock",
    "sdk/js/engine/src",
    "sdk/js/engine/wit",
    "sdk/Cargo.toml",
    "sdk/src",
    "rust-toolchain.toml",
];

/// The committed engine component, relative to the repository root.
pub const WASM: &str = "crates/js-engine/prebuilt/engine.wasm";

/// The committed [`Stamp`] of [`WASM`], relative to the repository root.
pub const SOURCES: &str = "crates/js-engine/prebuilt/engine.sources";

/// The command that rebuilds the engine and rewrites [`WASM`] and [`SOURCES`].
pub const REBUILD: &str = "cargo xtask engine";

/// What [`REBUILD`] needs on Debian or Ubuntu.
pub const INSTALL: &str = "apt-get install -y clang wasi-libc llvm";

/// The digest of the engine's [`INPUTS`] under the repository `root`.
pub fn sources_digest(root: &Path) -> Result<String, Error> {
    let mut digest = Digest::new(root);
    for input in INPUTS {
        digest.add(input)?;
    }
    Ok(digest.hex())
}

/// The digest of an engine component's bytes.
pub fn wasm_digest(wasm: &[u8]) -> String {
    blake3::hash(wasm).to_hex().to_string()
}

/// What [`SOURCES`] records: the digest of the sources the committed
/// component was built from, and of the component itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    /// [`sources_digest`] when the component was built.
    pub sources: String,
    /// [`wasm_digest`] of the component.
    pub wasm: String,
}

impl Stamp {
    /// Reads a stamp from its text (`sources <hex>` and `wasm <hex>` lines;
    /// `#` comments).
    pub fn parse(text: &str) -> Option<Self> {
        let mut sources = None;
        let mut wasm = None;
        for line in text.lines().map(str::trim) {
            match line.split_once(' ') {
                Some(("sources", hex)) => sources = Some(hex.trim().to_owned()),
                Some(("wasm", hex)) => wasm = Some(hex.trim().to_owned()),
                _ => {}
            }
        }
        Some(Self {
            sources: sources?,
            wasm: wasm?,
        })
    }

    /// The stamp as [`SOURCES`] holds it.
    pub fn render(&self) -> String {
        format!(
            "# Written by `{REBUILD}`; checked by crates/js-engine/build.rs on every build.\n\
             # sources: blake3 of the engine's inputs (hearth_build_support::engine::INPUTS);\n\
             # wasm: blake3 of engine.wasm, built from them.\n\
             sources {}\nwasm {}\n",
            self.sources, self.wasm
        )
    }
}

/// Checks that the committed engine under `root` was built from today's
/// sources and is whole; the error says what to run when not.
pub fn check(root: &Path) -> Result<(), Error> {
    let rebuild = format!(
        "rebuild it with `{REBUILD}` (it needs clang, wasi-libc and llvm-ar; on Debian or \
         Ubuntu: {INSTALL}) and commit both files in crates/js-engine/prebuilt/"
    );
    let stamp_path = root.join(SOURCES);
    let text = fs::read_to_string(&stamp_path)
        .map_err(|e| format!("reading {}: {e}; {rebuild}", stamp_path.display()))?;
    let stamp = Stamp::parse(&text)
        .ok_or_else(|| format!("{} is not a stamp; {rebuild}", stamp_path.display()))?;
    let now = sources_digest(root)?;
    if now != stamp.sources {
        return Err(format!(
            "hearth's JS engine sources ({}) changed since {WASM} was built (digest {} then, \
             {now} now): {rebuild}",
            INPUTS.join(", "),
            stamp.sources
        )
        .into());
    }
    let wasm_path = root.join(WASM);
    let wasm = fs::read(&wasm_path).map_err(|e| format!("reading {}: {e}", wasm_path.display()))?;
    if wasm_digest(&wasm) != stamp.wasm {
        return Err(format!(
            "{} does not match the digest in {SOURCES} (a partial copy, or a Git LFS \
             pointer?): restore it with `git checkout -- {WASM}`, or {rebuild}",
            wasm_path.display()
        )
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_reads_back_what_it_renders() {
        let stamp = Stamp {
            sources: "ab".repeat(32),
            wasm: "cd".repeat(32),
        };
        assert_eq!(Stamp::parse(&stamp.render()), Some(stamp));
        assert_eq!(Stamp::parse("sources 00\n"), None);
    }

    #[test]
    fn the_committed_engine_matches_its_sources() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        if let Err(e) = check(&root) {
            panic!("{e}");
        }
    }

    #[test]
    fn an_edited_source_is_refused_with_the_command_to_run() {
        let tmp = std::env::temp_dir().join(format!("hearth-engine-check-{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        for input in INPUTS {
            let path = tmp.join(input);
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent).expect("temp dir");
            }
            if input.ends_with("src") || input.ends_with("wit") {
                fs::create_dir_all(&path).expect("temp dir");
                fs::write(path.join("a.rs"), "fn a() {}").expect("write");
            } else {
                fs::write(&path, "x").expect("write");
            }
        }
        let wasm = b"\0asm";
        fs::create_dir_all(tmp.join("crates/js-engine/prebuilt")).expect("temp dir");
        fs::write(tmp.join(WASM), wasm).expect("write");
        let stamp = Stamp {
            sources: sources_digest(&tmp).expect("digest"),
            wasm: wasm_digest(wasm),
        };
        fs::write(tmp.join(SOURCES), stamp.render()).expect("write");
        assert!(check(&tmp).is_ok());

        fs::write(tmp.join("sdk/js/engine/src/a.rs"), "fn a() { 1; }").expect("write");
        let err = check(&tmp)
            .expect_err("an edited source must be refused")
            .to_string();
        assert!(err.contains("changed since"), "{err}");
        assert!(err.contains(REBUILD), "{err}");

        fs::write(tmp.join("sdk/js/engine/src/a.rs"), "fn a() {}").expect("write");
        fs::write(tmp.join(WASM), b"\0asm!").expect("write");
        let err = check(&tmp)
            .expect_err("a changed component must be refused")
            .to_string();
        assert!(err.contains("does not match"), "{err}");
        let _ = fs::remove_dir_all(&tmp);
    }
}
