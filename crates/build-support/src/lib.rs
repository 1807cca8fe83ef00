//! # hearth-build-support
//!
//! What hearth's build tooling shares, in one neutral home instead of a file
//! one build script pulls out of another crate's folder with `#[path]`:
//!
//! * [`nested`]: the nested `cargo build --target wasm32-wasip2` of a guest
//!   workspace (the sample Workers' build script; `cargo xtask engine`).
//! * [`files`]: writes that leave an unchanged file (and so its mtime) alone,
//!   and a content digest of a set of files under a root.
//! * [`engine`]: the JS engine's inputs and the digest that ties the
//!   committed prebuilt engine (`crates/js-engine/prebuilt/`) to them,
//!   checked by `crates/js-engine/build.rs` on every build and rewritten by
//!   `cargo xtask engine`.
//!
//! It is a build-dependency, compiled for every build script that uses it:
//! it depends on `blake3` and `thiserror` only.

pub mod engine;
pub mod files;
pub mod nested;

/// A build step that failed, with the message that says what to do about it.
///
/// Build scripts print it and stop; its text is the whole story (the path,
/// the command that failed, the package or command that fixes it).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Error(String);

impl Error {
    /// An error with this message.
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

impl From<String> for Error {
    fn from(message: String) -> Self {
        Self(message)
    }
}
