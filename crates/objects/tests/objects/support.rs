//! What the tests share: a node's `Objects` over a temporary SQLite fence,
//! an etcd server of their own, and the re-executed child process that
//! plays an owner in another process.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hearth_objects::{
    BlobStore, DirBlobStore, EtcdFence, Fence, MemoryBlobStore, Namespace, ObjectKey,
    ObjectStorage, Objects, SqliteFence, StorageLimits,
};

/// The object most tests use.
pub(crate) fn counter() -> ObjectKey {
    let namespace = Namespace::new("app", "Counter");
    let id = namespace.id_from_name("global");
    ObjectKey { namespace, id }
}

/// A node's stores in a temporary directory: an SQLite fence file and
/// in-memory blobs. Each `objects()` is a new node over the same stores.
pub(crate) struct Stores {
    /// Holds the fence file (removed on drop).
    _dir: tempfile::TempDir,
    pub(crate) fence: Arc<dyn Fence>,
    pub(crate) blobs: Arc<dyn BlobStore>,
}

impl Stores {
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let fence = SqliteFence::open(dir.path().join("fence.sqlite")).expect("fence file");
        Self {
            _dir: dir,
            fence: Arc::new(fence),
            blobs: Arc::new(MemoryBlobStore::new()),
        }
    }

    /// A node over these stores with `limits`.
    pub(crate) fn objects_with(&self, limits: StorageLimits) -> Objects {
        Objects::new(Arc::clone(&self.fence), Arc::clone(&self.blobs), limits)
    }

    /// A node over these stores with the default limits.
    pub(crate) fn objects(&self) -> Objects {
        self.objects_with(StorageLimits::default())
    }

    /// The object `counter()` opened (claimed) by a new node.
    pub(crate) async fn open(&self) -> ObjectStorage {
        self.objects().open(&counter()).await.expect("open")
    }
}

/// `key`'s value as text, for short assertions.
pub(crate) fn text(storage: &mut ObjectStorage, key: &str) -> Option<String> {
    let mut values = storage.get(&[key.to_owned()]).expect("get");
    values
        .pop()
        .flatten()
        .map(|v| String::from_utf8(v).expect("test values are text"))
}

/// Stores one text value.
pub(crate) fn put(storage: &mut ObjectStorage, key: &str, value: &str) {
    storage
        .put(vec![(key.to_owned(), value.as_bytes().to_vec())])
        .expect("put");
}

/// An etcd server of the test's own, on free ports of 127.0.0.1 with a
/// temporary data directory; killed on drop.
pub(crate) struct Etcd {
    child: Child,
    pub(crate) endpoint: String,
    _data: tempfile::TempDir,
}

impl Etcd {
    /// Starts etcd, or returns `None` (saying so) when it is not installed
    /// and HEARTH_REQUIRE_ETCD is not 1.
    pub(crate) fn start() -> Option<Self> {
        let installed = Command::new("etcd")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !installed {
            if std::env::var("HEARTH_REQUIRE_ETCD").as_deref() == Ok("1") {
                panic!(
                    "etcd is not installed and HEARTH_REQUIRE_ETCD=1 (apt-get install etcd-server)"
                );
            }
            eprintln!("skipping: etcd is not installed (apt-get install etcd-server)");
            return None;
        }
        let client = free_port();
        let peer = free_port();
        let data = tempfile::tempdir().expect("etcd data directory");
        let endpoint = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(data.path().join("etcd.log")).expect("etcd log");
        let child = Command::new("etcd")
            .arg("--name=test")
            .arg(format!("--data-dir={}", data.path().join("data").display()))
            .arg(format!("--listen-client-urls={endpoint}"))
            .arg(format!("--advertise-client-urls={endpoint}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=test={peer_url}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting etcd");
        let etcd = Self {
            child,
            endpoint,
            _data: data,
        };
        etcd.wait_healthy(client);
        Some(etcd)
    }

    fn wait_healthy(&self, port: u16) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if health(port).is_some_and(|body| body.contains("\"health\":\"true\"")) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "etcd did not become healthy; its log: {}",
                std::fs::read_to_string(self._data.path().join("etcd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A fence over this etcd.
    pub(crate) fn fence(&self) -> Arc<dyn Fence> {
        Arc::new(EtcdFence::new([self.endpoint.clone()], "hearth-test/").expect("etcd fence"))
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn health(port: u16) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream
        .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    Some(answer)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Which fence the child process opens: `sqlite:<file>` or `etcd:<url>`.
pub(crate) fn fence_from_spec(spec: &str) -> Arc<dyn Fence> {
    if let Some(path) = spec.strip_prefix("sqlite:") {
        Arc::new(SqliteFence::open(path).expect("fence file"))
    } else if let Some(endpoint) = spec.strip_prefix("etcd:") {
        Arc::new(EtcdFence::new([endpoint], "hearth-test/").expect("etcd fence"))
    } else {
        panic!("unknown fence spec {spec:?}")
    }
}

/// Environment of the re-executed test binary that plays owner A.
pub(crate) const CHILD_FENCE: &str = "HEARTH_OBJECTS_TEST_CHILD_FENCE";
/// The directory the two processes share (blobs, ready/go files).
pub(crate) const CHILD_DIR: &str = "HEARTH_OBJECTS_TEST_CHILD_DIR";

/// Re-executes this test binary to run only `test` (which sees the child
/// environment and plays owner A).
pub(crate) fn spawn_child(test: &str, fence_spec: &str, dir: &Path) -> Child {
    let exe = std::env::current_exe().expect("the test binary's path");
    Command::new(exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_FENCE, fence_spec)
        .env(CHILD_DIR, dir)
        .spawn()
        .expect("re-executing the test binary")
}

/// Waits until `path` exists (the other process's signal).
pub(crate) async fn wait_for_file(path: &Path, child: Option<&mut Child>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut child = child;
    while !path.exists() {
        if let Some(child) = child.as_deref_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            panic!(
                "the other process exited ({status}) before {}",
                path.display()
            );
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A directory blob store in `dir`, as both processes open it.
pub(crate) fn dir_blobs(dir: &Path) -> Arc<dyn BlobStore> {
    Arc::new(DirBlobStore::new(dir.join("blobs")))
}

/// The path of a signal file in the shared directory.
pub(crate) fn signal(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}
