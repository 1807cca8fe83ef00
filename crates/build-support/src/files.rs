//! Files a build writes and digests of files it reads.
//!
//! A build script's outputs are written only when their bytes change
//! ([`write_if_changed`]), so an unchanged component keeps its mtime and
//! does not make cargo rebuild what embeds it. A set of inputs is named by a
//! [`Digest`] of their paths (relative to a root, so two checkouts agree)
//! and contents: the sample Workers' slow foreign builds are skipped when
//! it matches, and the prebuilt JS engine is tied to its sources by one.

use std::fs;
use std::path::{Path, PathBuf};

use crate::Error;

/// Copies `from` to `to` with [`write_if_changed`].
pub fn copy_if_changed(from: &Path, to: &Path) -> Result<(), Error> {
    let bytes = fs::read(from).map_err(|e| format!("reading {}: {e}", from.display()))?;
    write_if_changed(to, &bytes)
}

/// Writes `bytes` to `path` unless it already holds them (keeping its mtime,
/// so unchanged components do not trigger rebuilds). Writes go to a temporary
/// file renamed into place, so a reader never sees a partial file.
pub fn write_if_changed(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    if fs::read(path).is_ok_and(|old| old == bytes) {
        return Ok(());
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    fs::write(&tmp, bytes).map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    fs::rename(&tmp, path).map_err(|e| format!("renaming into {}: {e}", path.display()).into())
}

/// A blake3 digest of a set of files: each file's path relative to a root
/// (with `/` separators), its length and its bytes, in sorted order.
///
/// Symbolic links are followed, and a file is named by the path it was
/// reached by, so moving what a link points at changes nothing.
pub struct Digest {
    root: PathBuf,
    hasher: blake3::Hasher,
}

impl Digest {
    /// A digest of files named relative to `root`.
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
            hasher: blake3::Hasher::new(),
        }
    }

    /// Adds `relative` (a file, or a directory and everything under it).
    pub fn add(&mut self, relative: &str) -> Result<(), Error> {
        let path = self.root.join(relative);
        self.add_tree(&path, relative)
    }

    fn add_tree(&mut self, path: &Path, name: &str) -> Result<(), Error> {
        let meta = fs::metadata(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        if meta.is_dir() {
            let mut children: Vec<String> = fs::read_dir(path)
                .map_err(|e| format!("reading {}: {e}", path.display()))?
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            children.sort();
            for child in children {
                self.add_tree(&path.join(&child), &format!("{name}/{child}"))?;
            }
        } else {
            let bytes = fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
            self.hasher.update(name.as_bytes());
            self.hasher.update(&[0]);
            self.hasher.update(&(bytes.len() as u64).to_le_bytes());
            self.hasher.update(&bytes);
        }
        Ok(())
    }

    /// The digest, as lowercase hex.
    pub fn hex(&self) -> String {
        self.hasher.finalize().to_hex().to_string()
    }
}
