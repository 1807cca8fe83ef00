//! The packaging under `deploy/kubernetes/` and the `Dockerfile`, checked
//! without a cluster or Docker: every manifest parses, and the fields that
//! must agree with hearth's own config do (probe paths and ports, the
//! grace period against `drain_timeout`, every Secret and ConfigMap that is
//! referenced exists with the keys used, the ConfigMap's `hearth.toml` is a
//! config `hearth serve` accepts once the pod's variables are set). The
//! Dockerfile's build command must be the one docs/container.md gives.
//!
//! This is a schema check of the fields hearth relies on, not a full
//! Kubernetes schema validation (`kubeconform` is not packaged in the
//! registries this project uses).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_norway::Value;

use hearth::config::{NodeConfig, expand_env};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every document of every manifest, with the file it came from.
fn manifests() -> Vec<(PathBuf, Value)> {
    let dir = root().join("deploy/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("deploy/kubernetes")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in {}", dir.display());
    let mut docs = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read manifest");
        for doc in serde_norway::Deserializer::from_str(&text) {
            let value = <Value as serde::Deserialize>::deserialize(doc)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            if !value.is_null() {
                docs.push((file.clone(), value));
            }
        }
    }
    docs
}

/// `v` at `path` (mapping keys, or sequence indexes written as numbers,
/// separated by `.`, or by `/` where a key has a dot).
fn at<'a>(v: &'a Value, path: &str) -> &'a Value {
    let mut cur = v;
    let sep = if path.contains('/') { '/' } else { '.' };
    for key in path.split(sep) {
        cur = match key.parse::<usize>() {
            Ok(i) => cur.get(i),
            Err(_) => cur.get(key),
        }
        .unwrap_or_else(|| panic!("no {path} (stopped at {key}) in {v:?}"));
    }
    cur
}

fn str_at<'a>(v: &'a Value, path: &str) -> &'a str {
    at(v, path)
        .as_str()
        .unwrap_or_else(|| panic!("{path} is not a string"))
}

fn kind(v: &Value) -> &str {
    str_at(v, "kind")
}

fn name(v: &Value) -> &str {
    str_at(v, "metadata.name")
}

fn seq<'a>(v: &'a Value, path: &str) -> &'a Vec<Value> {
    at(v, path)
        .as_sequence()
        .unwrap_or_else(|| panic!("{path} is not a list"))
}

/// Each document has the fields every object needs; the kinds are the ones
/// we ship, once each (a duplicate name would silently replace another).
#[test]
fn every_manifest_parses_and_names_its_object() {
    let docs = manifests();
    let mut seen = BTreeSet::new();
    for (file, doc) in &docs {
        let api = str_at(doc, "apiVersion");
        let k = kind(doc);
        if k == "Kustomization" {
            continue;
        }
        let n = name(doc);
        assert!(!api.is_empty() && !n.is_empty(), "{}", file.display());
        if k != "Namespace" {
            assert_eq!(
                str_at(doc, "metadata.namespace"),
                "hearth",
                "{}",
                file.display()
            );
        }
        assert!(seen.insert((k.to_string(), n.to_string())), "{k}/{n} twice");
    }
    for wanted in [
        "StatefulSet",
        "Service",
        "ConfigMap",
        "Secret",
        "PodDisruptionBudget",
    ] {
        assert!(
            seen.iter().any(|(k, _)| k == wanted),
            "no {wanted} in deploy/kubernetes"
        );
    }
    // The kustomization lists every manifest file.
    let listed: BTreeSet<String> = docs
        .iter()
        .filter(|(_, d)| kind(d) == "Kustomization")
        .flat_map(|(_, d)| seq(d, "resources").iter())
        .map(|r| r.as_str().expect("resource path").to_string())
        .collect();
    let files: BTreeSet<String> = docs
        .iter()
        .filter(|(_, d)| kind(d) != "Kustomization")
        .map(|(f, _)| {
            f.file_name()
                .expect("file name")
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(listed, files, "kustomization.yaml resources");
}

fn one<'a>(docs: &'a [(PathBuf, Value)], k: &str, n: &str) -> &'a Value {
    docs.iter()
        .map(|(_, d)| d)
        .find(|d| kind(d) == k && name(d) == n)
        .unwrap_or_else(|| panic!("no {k}/{n}"))
}

fn statefulset(docs: &[(PathBuf, Value)]) -> &Value {
    docs.iter()
        .map(|(_, d)| d)
        .find(|d| kind(d) == "StatefulSet")
        .expect("a StatefulSet")
}

/// The ConfigMap's `hearth.toml`, parsed as `hearth serve` parses it, with
/// the variables the pod has (its hostname, its IP, the secrets) set.
fn node_config(docs: &[(PathBuf, Value)]) -> NodeConfig {
    let sts = statefulset(docs);
    let volumes = seq(sts, "spec.template.spec.volumes");
    let cm_name = volumes
        .iter()
        .find_map(|v| v.get("configMap").map(|c| str_at(c, "name")))
        .expect("a ConfigMap volume");
    let text = str_at(one(docs, "ConfigMap", cm_name), "data/hearth.toml");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("hearth.toml");
    std::fs::write(&path, text).expect("write config");
    NodeConfig::load(&path).expect("the ConfigMap's hearth.toml parses")
}

#[test]
fn the_statefulset_matches_the_config_it_mounts() {
    let docs = manifests();
    let sts = statefulset(&docs);
    let cfg = node_config(&docs);
    let pod = at(sts, "spec.template.spec");
    let container = at(pod, "containers.0");

    // Probes on the admin listener's port.
    let admin = cfg.admin.expect("admin in the config");
    let ports: BTreeMap<&str, u64> = seq(container, "ports")
        .iter()
        .map(|p| {
            (
                str_at(p, "name"),
                at(p, "containerPort").as_u64().expect("port"),
            )
        })
        .collect();
    let probe_port = |probe: &str| {
        let port = at(container, &format!("{probe}.httpGet.port"));
        match port.as_str() {
            Some(named) => *ports
                .get(named)
                .unwrap_or_else(|| panic!("{probe} names port {named}, which is not declared")),
            None => port.as_u64().expect("a port number"),
        }
    };
    for (probe, path) in [
        ("livenessProbe", "/livez"),
        ("readinessProbe", "/readyz"),
        ("startupProbe", "/livez"),
    ] {
        assert_eq!(str_at(container, &format!("{probe}.httpGet.path")), path);
        assert_eq!(
            probe_port(probe),
            u64::from(admin.port()),
            "{probe}: the admin port"
        );
    }
    assert!(admin.ip().is_unspecified(), "the kubelet probes the pod IP");
    let listen = cfg.listen.expect("listen in the config");
    assert_eq!(ports["http"], u64::from(listen.port()));

    // A drain is never cut short by the kubelet's SIGKILL.
    let grace = at(pod, "terminationGracePeriodSeconds")
        .as_u64()
        .expect("terminationGracePeriodSeconds");
    let drain = cfg.serve_limits().expect("limits").drain_timeout;
    assert!(
        Duration::from_secs(grace) > drain,
        "terminationGracePeriodSeconds {grace} must be above drain_timeout {drain:?}"
    );

    // The cluster section: the container's ports, the seeds through the
    // headless Service, the node ID from the pod's hostname.
    let cluster = cfg.cluster.as_ref().expect("[cluster]");
    let env: BTreeMap<&str, &Value> = seq(container, "env")
        .iter()
        .map(|e| (str_at(e, "name"), e))
        .collect();
    let fake_env = |name: &str| match name {
        "HOSTNAME" => Some("hearth-0".to_string()),
        "POD_IP" => Some("10.0.0.7".to_string()),
        n if env.contains_key(n) => Some("x".repeat(64)),
        _ => None,
    };
    assert_eq!(
        cfg.node_id.as_deref(),
        Some("$HOSTNAME"),
        "one config for every pod"
    );
    let rpc = expand(&cluster.rpc.to_string(), &fake_env);
    assert_eq!(rpc, format!("10.0.0.7:{}", ports["rpc"]));
    let gossip = expand(
        &cluster.gossip.as_ref().expect("gossip").to_string(),
        &fake_env,
    );
    assert_eq!(gossip, format!("10.0.0.7:{}", ports["gossip"]));
    assert!(
        env.get("POD_IP")
            .is_some_and(|e| str_at(e, "valueFrom.fieldRef.fieldPath") == "status.podIP"),
        "POD_IP from the downward API"
    );
    let headless = one(&docs, "Service", str_at(sts, "spec.serviceName"));
    assert_eq!(str_at(headless, "spec.clusterIP"), "None", "headless");
    assert_eq!(
        at(headless, "spec.publishNotReadyAddresses").as_bool(),
        Some(true),
        "seeds must resolve before pods are ready"
    );
    let seed = cluster.seeds.first().expect("a seed").to_string();
    assert!(
        seed.starts_with(&format!(
            "{}.{}.svc",
            name(headless),
            str_at(headless, "metadata.namespace")
        )),
        "the seed {seed} is the headless Service"
    );
    assert!(seed.ends_with(&format!(":{}", ports["gossip"])));
    assert_eq!(
        str_at(sts, "spec.podManagementPolicy"),
        "Parallel",
        "a pod is ready only once it met a peer: ordered start would wait forever"
    );

    // Every secret the config names is set from the Secret.
    for (setting, value) in [
        ("artifact_key", cfg.artifact_key.as_deref()),
        ("admin_token", cfg.admin_token.as_deref()),
        ("gossip_key", cluster.gossip_key.as_deref()),
    ] {
        let value = value.unwrap_or_else(|| panic!("{setting} in the config"));
        let var = value.trim_start_matches('$').trim_matches(['{', '}']);
        let e = env
            .get(var)
            .unwrap_or_else(|| panic!("{setting} = {value}: no env {var} in the StatefulSet"));
        at(e, "valueFrom.secretKeyRef");
    }
    let mut full = node_config(&docs);
    // The pod's view: with its variables set, hearth accepts the config.
    full.artifact_key = Some("5d".repeat(32));
    full.admin_token = Some("t".repeat(40));
    full.cluster.as_mut().expect("[cluster]").gossip_key = Some("6b".repeat(32));
    full.check_secrets()
        .expect("the pod's secrets are accepted");
    let s3 = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"];
    if cfg.store.as_deref().is_some_and(|s| s.starts_with("s3://")) {
        for var in s3 {
            let e = env
                .get(var)
                .unwrap_or_else(|| panic!("S3 store: no env {var}"));
            at(e, "valueFrom.secretKeyRef");
        }
    }
}

/// `template` with the pod's variables from `env`.
fn expand(template: &str, env: &dyn Fn(&str) -> Option<String>) -> String {
    // expand_env reads the process environment; the pod's is simulated by
    // substituting the names it uses first.
    let mut out = template.to_string();
    for name in ["POD_IP", "HOSTNAME"] {
        if let Some(v) = env(name) {
            out = out
                .replace(&format!("${{{name}}}"), &v)
                .replace(&format!("${name}"), &v);
        }
    }
    expand_env("test", &out).expect("no other variables")
}

/// Every Secret and ConfigMap the StatefulSet references exists, with the
/// keys it reads.
#[test]
fn every_referenced_secret_and_configmap_exists() {
    let docs = manifests();
    let sts = statefulset(&docs);
    let pod = at(sts, "spec.template.spec");
    for e in seq(pod, "containers.0.env") {
        if let Some(r) = e.get("valueFrom").and_then(|v| v.get("secretKeyRef")) {
            let secret = one(&docs, "Secret", str_at(r, "name"));
            let key = str_at(r, "key");
            let has = ["stringData", "data"]
                .iter()
                .any(|section| secret.get(section).and_then(|d| d.get(key)).is_some());
            assert!(has, "Secret {} has no key {key}", name(secret));
        }
    }
    for v in seq(pod, "volumes") {
        if let Some(s) = v.get("secret") {
            one(&docs, "Secret", str_at(s, "secretName"));
        }
        if let Some(c) = v.get("configMap") {
            one(&docs, "ConfigMap", str_at(c, "name"));
        }
    }
    // Every volume mounted is declared.
    let volumes: BTreeSet<&str> = seq(pod, "volumes")
        .iter()
        .map(|v| str_at(v, "name"))
        .collect();
    for m in seq(pod, "containers.0.volumeMounts") {
        assert!(volumes.contains(str_at(m, "name")), "{m:?}");
    }
    // The Services and the PodDisruptionBudget select the StatefulSet's pods.
    let labels = at(sts, "spec.template.metadata.labels");
    let selects = |selector: &Value| {
        selector
            .as_mapping()
            .expect("selector")
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
    };
    for (_, d) in &docs {
        match kind(d) {
            "Service" => assert!(selects(at(d, "spec.selector")), "{}", name(d)),
            "PodDisruptionBudget" => {
                assert!(selects(at(d, "spec.selector.matchLabels")), "{}", name(d))
            }
            _ => {}
        }
    }
}

/// The Dockerfile builds with the command its doc gives, runs as non-root,
/// exposes the config's ports and starts `hearth serve`.
#[test]
fn the_dockerfile_builds_as_its_doc_says() {
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).expect("Dockerfile");
    let doc = std::fs::read_to_string(root().join("docs/container.md")).expect("docs/container.md");
    let build = dockerfile
        .lines()
        .find_map(|l| l.trim().strip_prefix("RUN cargo build "))
        .map(|rest| {
            format!(
                "cargo build {}",
                rest.trim_end_matches('\\')
                    .split("&&")
                    .next()
                    .unwrap_or("")
                    .trim()
            )
        })
        .expect("a RUN cargo build line");
    assert!(
        doc.lines().any(|l| l.trim() == build),
        "docs/container.md does not give the Dockerfile's build command `{build}`"
    );
    assert!(
        doc.contains("docker build -t hearth ."),
        "docs/container.md gives the image build"
    );
    assert!(
        dockerfile.contains("rustup target add wasm32-wasip2"),
        "the sample Workers need the guest target"
    );
    let from: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert_eq!(from.len(), 2, "multi-stage: a builder and the image");
    let user = dockerfile
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("a USER");
    assert!(
        !user.starts_with("root") && !user.starts_with('0'),
        "{user}"
    );
    assert!(
        dockerfile.contains(r#"ENTRYPOINT ["/usr/local/bin/hearth", "serve"]"#),
        "the image runs a node"
    );
    let exposed: BTreeSet<String> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("EXPOSE "))
        .flat_map(|l| l.split_whitespace())
        .map(str::to_string)
        .collect();
    let docs = manifests();
    let cfg = node_config(&docs);
    for port in [
        cfg.listen.expect("listen").port().to_string(),
        cfg.admin.expect("admin").port().to_string(),
        "7000".to_string(),
        "7001/udp".to_string(),
    ] {
        assert!(exposed.contains(&port), "EXPOSE {port}: {exposed:?}");
    }
    let ignore = std::fs::read_to_string(root().join(".dockerignore")).expect(".dockerignore");
    assert!(
        ignore.lines().any(|l| l.trim() == "target/"),
        "the build context leaves target/ out"
    );
}
