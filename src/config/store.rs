//! Opening the script store a node runs from.
//!
//! A node's store is a directory, or an S3 bucket and prefix
//! (`s3://bucket/prefix`). A directory store holds everything: Worker
//! sources, the artifact cache and the node's secrets. An S3 store holds
//! the sources only; each node keeps its own files (artifact cache, admin
//! token, development certificates) in its data directory, and every node
//! must be given the same `artifact_key`, since they share precompiled
//! artifacts. [`NodeStore::open`] contacts an S3 store once, so a wrong
//! endpoint or key stops the node at start with the store's own message.

use std::path::PathBuf;
use std::sync::Arc;

use hearth_runtime::{DirStore, RuntimeConfig, S3Store, ScriptStore};

use super::secrets::{fresh_key, parse_key};
use super::{NodeConfig, NodeConfigError, runtime_config};

/// Where a node keeps Worker sources, and its own files.
#[derive(Clone)]
pub struct NodeStore {
    /// The node's own directory: the store itself for a directory store,
    /// else the data directory (artifact cache, admin token, certificates).
    pub data_dir: PathBuf,
    /// The script store.
    pub scripts: Arc<dyn ScriptStore>,
    /// The runtime configuration to start from: sources in `scripts`,
    /// artifacts cached in `local`, authenticated with the cluster's key.
    pub runtime: RuntimeConfig,
}

impl NodeStore {
    /// Opens the store at `location` (a directory, or `s3://bucket/prefix`
    /// with `file`'s `[s3]`, `data` and `artifact_key`). An S3 store is
    /// contacted once, so a wrong endpoint or key stops the node at start
    /// with the store's own message. Must run inside the node's Tokio
    /// runtime.
    pub async fn open(location: &str, file: &NodeConfig) -> Result<NodeStore, NodeConfigError> {
        if !hearth_runtime::store::s3_store::is_s3_url(location) {
            let dir = PathBuf::from(location);
            let mut runtime = runtime_config(&dir)?;
            if let Some(hex) = &file.artifact_key {
                runtime = runtime.artifact_key(parse_key("artifact_key", hex)?);
            }
            let scripts = DirStore::open(&dir).map_err(NodeConfigError::OpenStore)?;
            return Ok(NodeStore {
                data_dir: dir,
                scripts: Arc::new(scripts),
                runtime,
            });
        }
        let Some(hex) = &file.artifact_key else {
            return Err(NodeConfigError::NoArtifactKey {
                location: location.to_string(),
                fresh: fresh_key(),
            });
        };
        let key = parse_key("artifact_key", hex)?;
        let data_dir = file
            .data
            .clone()
            .unwrap_or_else(|| PathBuf::from("hearth-data"));
        std::fs::create_dir_all(&data_dir).map_err(|error| NodeConfigError::DataDir {
            path: data_dir.clone(),
            error,
        })?;
        let s3 = S3Store::open(location, &file.s3.clone().unwrap_or_default())
            .map_err(NodeConfigError::OpenStore)?;
        s3.check().await.map_err(NodeConfigError::UseStore)?;
        Ok(NodeStore {
            runtime: RuntimeConfig::new(&data_dir).artifact_key(key),
            data_dir,
            scripts: Arc::new(s3),
        })
    }
}
