//! The admin API of a node (token-protected, except the health checks
//! `/healthz`, `/livez` and `/readyz`, and `/metrics` unless the node's
//! `admin_metrics = "token"`: see [`MetricsAccess`]):
//!
//! | method | path                          | what                          |
//! |--------|-------------------------------|-------------------------------|
//! | PUT    | `/v1/scripts/{id}?plan=free&lifecycle=auto` | deploy the body as Worker `id` (bindings: see below), and tell every member |
//! | GET    | `/v1/scripts`                 | list deployed scripts          |
//! | POST   | `/v1/scripts/{id}/evict`      | evict `id` from this node      |
//! | POST   | `/v1/scripts/{id}/hand-back`  | prewarm `id` at its home and drop every other node's copy ([`crate::node::HandBack`]) |
//! | PUT    | `/v1/scripts/{id}/secrets/{name}` | set secret `name` of `id` to the body (UTF-8), and tell every member |
//! | GET    | `/v1/scripts/{id}/secrets`    | the names of `id`'s secrets (never a value) |
//! | DELETE | `/v1/scripts/{id}/secrets/{name}` | delete secret `name` of `id`, and tell every member |
//! | GET    | `/v1/scripts/{id}/versions`   | `id`'s versions, its current deployment, and this node's per-version counts during a split ([`hearth_runtime::store::versions`]) |
//! | PUT    | `/v1/scripts/{id}/deployment` | make the body (JSON `{"split":[{"version":7,"percent":10},{"version":6,"percent":90}]}`) `id`'s deployment, and tell every member |
//! | POST   | `/v1/scripts/{id}/rollback?version=N` | roll `id` back to version `N` (default: the one before the current) at 100%, and tell every member |
//! | GET    | `/v1/scripts/{id}/tail?status=5xx&sample=0.1&scope=cluster` | `id`'s requests as they finish on every member (`scope=node`: on this node only): server-sent events, one JSON event per `data:` line ([`crate::live_tail`]) |
//! | GET    | `/v1/stats`                   | runtime counters (JSON)        |
//! | GET    | `/v1/ring?script={id}`        | the ring as this node sees it, and `id`'s home and successors ([`RingView`]) |
//! | GET    | `/metrics`                    | Prometheus metrics             |
//! | GET    | `/healthz`, `/livez`          | `ok`: the process is alive     |
//! | GET    | `/readyz`                     | `ready`, or 503 `not ready: <why>` ([`crate::node::NotReady`]): draining, store not answering, or not yet joined; the store's own error only with the token |
//!
//! A deploy's [bindings](hearth_runtime::outbound::bindings) are query parameters
//! too, each repeatable: `service=<name>:<script>`, `dispatch=<namespace>:<script>`
//! (one user Worker per parameter), `tail=<script>`, and `outbound=<script>`
//! once; so is the allow-list of origins, `allow_host=<scheme://host[:port]>`
//! (repeatable, see [`hearth_runtime::outbound::egress`]; a bad entry is a 422 that
//! says why); Durable Object bindings are `durable_object=<name>:<Class>`
//! or `durable_object=<name>:<Class>@<script>` (repeatable, see
//! [`hearth_runtime::objects`]). The deploy report and `GET /v1/scripts`
//! show them under `bindings`.
//! Vars are `var=<NAME>=<value>`, repeatable ([`hearth_runtime::store::secrets`]).
//! No answer carries a secret's value: wherever a script's metadata is
//! shown, its `secrets` are the list of their names.
//! `dispatch_only=true` deploys a user Worker that clients cannot address
//! directly ([`hearth_runtime::store::manifest`]).
//!
//! A deploy answers once every other member of the cluster has dropped a
//! stale copy (its `announced` field counts them, see
//! [`crate::node::Announcement`]). A store that cannot be reached makes a
//! deploy or a listing fail with 503 and the store's message; nothing is
//! half-written.

use http::{Method, StatusCode};

use hearth_runtime::body::{self, Body};
use hearth_runtime::{DeployError, Lifecycle, Manifest, Plan};

use crate::node::Node;
use hearth_admin_client::{RingMember, RingView, ScriptPlacement};
use hearth_runtime::body::text_response as text;
use subtle::ConstantTimeEq;

/// The largest upload accepted, raw (the plan limit applies compressed).
pub const MAX_UPLOAD: usize = 64 << 20;

/// Who may read `/metrics`: the metrics name the busiest Workers (a
/// `script` label each) and count store and RPC failures, which is more
/// than a stranger should learn. `open` (the default) serves them to anyone
/// who reaches the admin port, for a scraper on a trusted network;
/// `token` asks for the admin token as every other admin route does
/// (Prometheus sends it with `authorization: { credentials_file: ... }`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricsAccess {
    /// Anyone who reaches the admin listener.
    #[default]
    Open,
    /// Only with the admin token.
    Token,
}

/// What the admin API accepts: its token, and whether `/metrics` needs it.
#[derive(Debug, Clone)]
pub struct AdminAccess {
    /// The admin token (`Authorization: Bearer <token>`).
    pub token: std::sync::Arc<str>,
    /// Who may read `/metrics`.
    pub metrics: MetricsAccess,
}

impl AdminAccess {
    /// Access with `token`, metrics open (the default).
    pub fn new(token: std::sync::Arc<str>) -> Self {
        AdminAccess {
            token,
            metrics: MetricsAccess::Open,
        }
    }

    /// Whether `req` carries the admin token.
    fn authorized(&self, req: &http::Request<Body>) -> bool {
        req.headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token)
            .is_some_and(|t| bool::from(t.as_bytes().ct_eq(self.token.as_bytes())))
    }
}

/// The answer to a request without the admin token.
fn unauthorized() -> http::Response<Body> {
    text(
        StatusCode::UNAUTHORIZED,
        "missing or wrong admin token (Authorization: Bearer …)\n",
    )
}

/// Handles one admin request.
pub async fn handle(
    node: Node,
    access: AdminAccess,
    req: http::Request<Body>,
) -> http::Response<Body> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let authorized = access.authorized(&req);
    match (&method, path.as_str()) {
        (&Method::GET, "/healthz" | "/livez") => return text(StatusCode::OK, "ok\n"),
        (&Method::GET, "/readyz") => {
            return match node.readiness().await {
                Ok(()) => text(StatusCode::OK, "ready\n"),
                // The store's own error (a bucket, an endpoint, a
                // credential's name) only to whoever has the token.
                Err(why) if authorized => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not ready: {why}\n"),
                ),
                Err(why) => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not ready: {}\n", why.summary()),
                ),
            };
        }
        (&Method::GET, "/metrics") if access.metrics == MetricsAccess::Token && !authorized => {
            return unauthorized();
        }
        (&Method::GET, "/metrics") => {
            let mut r = text(StatusCode::OK, node.metrics().render());
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            return r;
        }
        _ => {}
    }
    if !authorized {
        return unauthorized();
    }
    let segments: Vec<String> = path
        .trim_matches('/')
        .split('/')
        .map(str::to_owned)
        .collect();
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    let query = query_pairs(req.uri());
    let endpoint = match (&method, segments.as_slice()) {
        (&Method::GET, ["v1", "stats"]) => Endpoint::Stats,
        (&Method::GET, ["v1", "ring"]) => {
            Endpoint::Ring(query_param(&query, "script").map(str::to_owned))
        }
        (&Method::GET, ["v1", "scripts"]) => Endpoint::List,
        (&Method::POST, ["v1", "scripts", id, "evict"]) => Endpoint::Evict(id.to_string()),
        (&Method::POST, ["v1", "scripts", id, "hand-back"]) => Endpoint::HandBack(id.to_string()),
        (&Method::PUT | &Method::POST, ["v1", "scripts", id]) => Endpoint::Deploy(id.to_string()),
        (&Method::GET, ["v1", "scripts", id, "secrets"]) => Endpoint::Secrets(id.to_string()),
        (&Method::GET, ["v1", "scripts", id, "tail"]) => Endpoint::Tail(id.to_string()),
        (&Method::PUT, ["v1", "scripts", id, "secrets", name]) => {
            Endpoint::PutSecret(id.to_string(), name.to_string())
        }
        (&Method::DELETE, ["v1", "scripts", id, "secrets", name]) => {
            Endpoint::DeleteSecret(id.to_string(), name.to_string())
        }
        (&Method::GET, ["v1", "scripts", id, "versions"]) => Endpoint::Versions(id.to_string()),
        (&Method::PUT, ["v1", "scripts", id, "deployment"]) => {
            Endpoint::SetDeployment(id.to_string())
        }
        (&Method::POST, ["v1", "scripts", id, "rollback"]) => Endpoint::Rollback(
            id.to_string(),
            query_param(&query, "version").map(str::to_owned),
        ),
        _ => {
            return text(
                StatusCode::NOT_FOUND,
                format!("no admin route {method} {path}\n"),
            );
        }
    };
    match endpoint {
        Endpoint::Versions(id) => match node.runtime().versions(&id).await {
            Ok(list) => json(StatusCode::OK, &list),
            Err(e) => version_error(&e),
        },
        Endpoint::SetDeployment(id) => {
            let body = match read_limited(req.into_body(), 64 << 10).await {
                Ok(b) => b,
                Err(e) => return text(StatusCode::PAYLOAD_TOO_LARGE, format!("{e}\n")),
            };
            #[derive(serde::Deserialize)]
            struct Split {
                split: Vec<hearth_runtime::store::meta::Share>,
            }
            let split: Split = match serde_json::from_slice(&body) {
                Ok(s) => s,
                Err(e) => {
                    return text(
                        StatusCode::BAD_REQUEST,
                        format!(
                            "expected {{\"split\":[{{\"version\":N,\"percent\":P}},…]}}: {e}\n"
                        ),
                    );
                }
            };
            match node.set_deployment(&id, &split.split).await {
                Ok(done) => json(StatusCode::OK, &done),
                Err(e) => version_error(&e),
            }
        }
        Endpoint::Rollback(id, version) => {
            let version = match version.map(|v| v.parse::<u64>()).transpose() {
                Ok(v) => v,
                Err(_) => {
                    return text(
                        StatusCode::BAD_REQUEST,
                        "version must be a version number\n",
                    );
                }
            };
            match node.rollback(&id, version).await {
                Ok(done) => json(StatusCode::OK, &done),
                Err(e) => version_error(&e),
            }
        }
        Endpoint::Tail(id) => crate::live_tail::response(
            &node,
            &id,
            query_param(&query, "status"),
            query_param(&query, "sample"),
            query_param(&query, "scope"),
        ),
        Endpoint::Secrets(id) => match node.runtime().secret_names(&id).await {
            Ok(names) => json(
                StatusCode::OK,
                &serde_json::json!({ "script_id": id, "secrets": names }),
            ),
            Err(e) => secret_error(&e),
        },
        Endpoint::PutSecret(id, name) => {
            let limit = hearth_runtime::store::secrets::MAX_VALUE_BYTES;
            let bytes = match read_limited(req.into_body(), limit).await {
                Ok(b) => zeroize::Zeroizing::new(b),
                Err(e) => {
                    return text(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        format!("secret {name}: {e}\n"),
                    );
                }
            };
            let Ok(value) = std::str::from_utf8(&bytes) else {
                let e = hearth_runtime::store::secrets::EnvError::NotText { name };
                return text(StatusCode::BAD_REQUEST, format!("{e}\n"));
            };
            match node.put_secret(&id, &name, value).await {
                Ok(announced) => json(
                    StatusCode::OK,
                    &serde_json::json!({ "script_id": id, "secret": name, "announced": announced }),
                ),
                Err(e) => secret_error(&e),
            }
        }
        Endpoint::DeleteSecret(id, name) => match node.delete_secret(&id, &name).await {
            Ok((deleted, announced)) => json(
                StatusCode::OK,
                &serde_json::json!({
                    "script_id": id, "secret": name, "deleted": deleted, "announced": announced
                }),
            ),
            Err(e) => secret_error(&e),
        },
        Endpoint::Stats => json(StatusCode::OK, &node.runtime().stats()),
        Endpoint::Ring(script) => json(StatusCode::OK, &ring_view(&node, script.as_deref())),
        Endpoint::List => match node.runtime().script_store().list().await {
            Ok(list) => json(StatusCode::OK, &list),
            Err(e) => text(store_status(&e), format!("{e}\n")),
        },
        Endpoint::HandBack(id) => match node.hand_back(&id).await {
            Some(done) => json(StatusCode::OK, &done),
            None => text(
                StatusCode::CONFLICT,
                format!("{} is not in a cluster: it serves {id} itself\n", node.id()),
            ),
        },
        Endpoint::Evict(id) => {
            let was = node.runtime().evict(&id);
            json(
                StatusCode::OK,
                &serde_json::json!({ "script_id": id, "evicted": was }),
            )
        }
        Endpoint::Deploy(id) => {
            let manifest = match manifest_from_query(&query) {
                Ok(m) => m,
                Err(e) => return text(StatusCode::BAD_REQUEST, format!("{e}\n")),
            };
            let bytes = match read_limited(req.into_body(), MAX_UPLOAD).await {
                Ok(b) => b,
                Err(e) => return text(StatusCode::PAYLOAD_TOO_LARGE, format!("{e}\n")),
            };
            match node.deploy(&id, manifest, bytes).await {
                Ok(report) => json(StatusCode::OK, &report),
                Err(e) => {
                    let status = match &e {
                        DeployError::TooLarge { .. } | DeployError::TooLargeUncompressed { .. } => {
                            StatusCode::PAYLOAD_TOO_LARGE
                        }
                        DeployError::Store(s) => store_status(s),
                        _ => StatusCode::UNPROCESSABLE_ENTITY,
                    };
                    text(status, format!("{e}\n"))
                }
            }
        }
    }
}

/// The answer for a secret that could not be put, deleted or listed.
fn secret_error(e: &hearth_runtime::store::secrets::SecretError) -> http::Response<Body> {
    use hearth_runtime::store::secrets::SecretError;
    let status = match e {
        SecretError::Env(_) => StatusCode::BAD_REQUEST,
        SecretError::UnknownScript(_) => StatusCode::NOT_FOUND,
        SecretError::Store(s) => store_status(s),
    };
    text(status, format!("{e}\n"))
}

/// The answer for versions that could not be listed, or a rollback or
/// split that could not be made.
fn version_error(e: &hearth_runtime::store::versions::VersionError) -> http::Response<Body> {
    use hearth_runtime::store::versions::VersionError;
    let status = match e {
        VersionError::UnknownScript(_) => StatusCode::NOT_FOUND,
        VersionError::NoSuchVersion { .. } | VersionError::NoEarlierVersion { .. } => {
            StatusCode::UNPROCESSABLE_ENTITY
        }
        VersionError::BadSplit(_) => StatusCode::BAD_REQUEST,
        VersionError::Store(s) => store_status(s),
    };
    text(status, format!("{e}\n"))
}

/// The status for a store failure: 503 when the store is unreachable (try
/// again later), 500 when what it holds is damaged.
fn store_status(e: &hearth_runtime::StoreError) -> StatusCode {
    match e {
        hearth_runtime::StoreError::Remote { .. } => StatusCode::SERVICE_UNAVAILABLE,
        hearth_runtime::StoreError::Contended { .. } => StatusCode::CONFLICT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The admin API call a request names (method and path), parsed once.
enum Endpoint {
    HandBack(String),
    Stats,
    Ring(Option<String>),
    List,
    Evict(String),
    Deploy(String),
    Secrets(String),
    PutSecret(String, String),
    DeleteSecret(String, String),
    Versions(String),
    SetDeployment(String),
    Rollback(String, Option<String>),
    Tail(String),
}

/// `node`'s ring, and `script`'s place on it, as `GET /v1/ring` answers.
fn ring_view(node: &Node, script: Option<&str>) -> RingView {
    let me = node.id().to_string();
    let Some(ring) = node.ring() else {
        return RingView {
            node: me.clone(),
            clustered: false,
            members: Vec::new(),
            script: script.map(|id| ScriptPlacement {
                script_id: id.to_string(),
                home: Some(me.clone()),
                successors: vec![me.clone()],
                warm_here: node.runtime().is_warm(id),
            }),
        };
    };
    let members = ring
        .ownership()
        .into_iter()
        .map(|(n, share)| RingMember {
            id: n.id.as_str().to_string(),
            rpc: n.rpc_addr,
            weight: n.weight,
            ownership: share,
            state: if n.id.as_str() == me { "self" } else { "up" }.into(),
        })
        .collect();
    let script = script.map(|id| ScriptPlacement {
        script_id: id.to_string(),
        home: ring.home(id).map(|n| n.id.as_str().to_string()),
        successors: ring
            .successors(id, 3)
            .into_iter()
            .map(|n| n.id.as_str().to_string())
            .collect(),
        warm_here: node.runtime().is_warm(id),
    });
    RingView {
        node: me,
        clustered: true,
        members,
        script,
    }
}

/// The token of an `Authorization: Bearer <token>` value; the scheme name
/// is case-insensitive (RFC 9110 §11.1).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start_matches(' '))
}

/// The deploy settings given as query parameters (`plan`, `lifecycle`,
/// the bindings), from the request's [`query_pairs`].
fn manifest_from_query(query: &[(String, String)]) -> Result<Manifest, String> {
    let mut m = Manifest::default();
    if let Some(p) = query_param(query, "plan") {
        m.plan = p.parse::<Plan>()?;
    }
    if let Some(l) = query_param(query, "lifecycle") {
        m.lifecycle = l.parse::<Lifecycle>()?;
    }
    if let Some(d) = query_param(query, "dispatch_only") {
        m.dispatch_only = match d {
            "true" | "1" => true,
            "false" | "0" => false,
            other => return Err(format!("dispatch_only={other}: expected true or false")),
        };
    }
    let split = |key: &str, v: &str| {
        v.split_once(':')
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .ok_or_else(|| format!("{key}={v}: expected {key}=<name>:<script-id>"))
    };
    for (k, v) in query {
        let (k, v) = (k.as_str(), v.as_str());
        match k {
            "service" => {
                let (name, target) = split(k, v)?;
                m.bindings.services.insert(name, target);
            }
            "dispatch" => {
                let (ns, worker) = split(k, v)?;
                m.bindings.dispatch.entry(ns).or_default().insert(worker);
            }
            "outbound" if m.bindings.outbound.is_some() => {
                return Err("at most one outbound Worker".into());
            }
            "outbound" => m.bindings.outbound = Some(v.to_string()),
            "tail" => m.bindings.tail.push(v.to_string()),
            "allow_host" => m.bindings.allowed_hosts.push(v.to_string()),
            "durable_object" => {
                let (name, class) = split(k, v)?;
                let class = class.parse().map_err(|e| format!("{k}={v}: {e}"))?;
                m.bindings.durable_objects.insert(name, class);
            }
            "var" => {
                let (name, value) = v
                    .split_once('=')
                    .ok_or_else(|| format!("var={v}: expected var=<NAME>=<value>"))?;
                m.vars.insert(name.to_string(), value.to_string());
            }
            _ => {}
        }
    }
    Ok(m)
}

/// The query parameters that deploy `m`'s settings, percent-encoded (what
/// `manifest_from_query` reads back).
pub fn manifest_query(m: &Manifest) -> String {
    let mut pairs = vec![
        ("plan", m.plan.to_string()),
        ("lifecycle", m.lifecycle.to_string()),
    ];
    for (name, target) in &m.bindings.services {
        pairs.push(("service", format!("{name}:{target}")));
    }
    for (ns, workers) in &m.bindings.dispatch {
        for w in workers {
            pairs.push(("dispatch", format!("{ns}:{w}")));
        }
    }
    if let Some(o) = &m.bindings.outbound {
        pairs.push(("outbound", o.clone()));
    }
    for t in &m.bindings.tail {
        pairs.push(("tail", t.clone()));
    }
    for h in &m.bindings.allowed_hosts {
        pairs.push(("allow_host", h.clone()));
    }
    for (name, class) in &m.bindings.durable_objects {
        pairs.push(("durable_object", format!("{name}:{class}")));
    }
    for (name, value) in &m.vars {
        pairs.push(("var", format!("{name}={value}")));
    }
    if m.dispatch_only {
        pairs.push(("dispatch_only", "true".into()));
    }
    // Serializing pairs of strings cannot fail.
    serde_urlencoded::to_string(&pairs).unwrap_or_default()
}

/// The query parameters of `uri`, percent-decoded, in their order (a name
/// may repeat). A query that does not parse counts as none.
fn query_pairs(uri: &http::Uri) -> Vec<(String, String)> {
    serde_urlencoded::from_str(uri.query().unwrap_or("")).unwrap_or_default()
}

/// The first value of parameter `name`.
fn query_param<'a>(query: &'a [(String, String)], name: &str) -> Option<&'a str> {
    query
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// A JSON response. Every `secrets` map in it (a script's metadata holds
/// its sealed secrets) is replaced by the list of its names, so no admin
/// answer carries a secret, sealed or not.
fn json(status: http::StatusCode, value: &impl serde::Serialize) -> http::Response<Body> {
    let bytes = serde_json::to_value(value)
        .map(|mut v| {
            names_only(&mut v);
            v
        })
        .and_then(|v| serde_json::to_vec_pretty(&v))
        .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}").into_bytes());
    let mut r = http::Response::new(body::full(bytes));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// Replaces every object under a `secrets` key in `v` by its keys: a
/// script's metadata as every admin answer shows it (sealed secrets are
/// never shown, only their names).
pub fn names_only(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::Object(map) => {
            for (k, child) in map.iter_mut() {
                if k == "secrets"
                    && let Value::Object(secrets) = child
                {
                    let names = secrets.keys().cloned().map(Value::String).collect();
                    *child = Value::Array(names);
                } else {
                    names_only(child);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(names_only),
        _ => {}
    }
}

/// Reads a whole body of at most `max` bytes.
async fn read_limited(body: Body, max: usize) -> Result<Vec<u8>, String> {
    use http_body_util::{BodyExt, LengthLimitError, Limited};
    // Boxed before it is awaited: the future then holds no `Limited<_>`,
    // whose error bound rustc cannot prove `Send` for through `async`.
    let limited = Limited::new(body, max).boxed_unsync();
    match limited.collect().await {
        Ok(collected) => Ok(collected.to_bytes().into()),
        Err(e) if e.is::<LengthLimitError>() => {
            Err(format!("body is over the limit of {max} bytes"))
        }
        Err(e) => Err(format!("reading the body failed: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bindings_travel_as_query_parameters_and_back() {
        let m = Manifest::from_toml(
            "plan = \"paid\"\noutbound = \"egress\"\ntail = [\"t1\", \"t2\"]\ndispatch_only = true\n\
             allowed_hosts = [\"https://api.example.com\", \"http://*.example.com:8080\"]\n\
             [services]\nauth = \"auth-worker\"\n[dispatch]\nusers = [\"a\", \"b\"]\n\
             [durable_objects]\nCOUNTER = \"Counter\"\nROOMS = { class = \"Room\", script = \"chat\" }\n",
        )
        .expect("manifest");
        assert_eq!(m.bindings.durable_objects.len(), 2);
        let uri: http::Uri = format!("/v1/scripts/x?{}", manifest_query(&m))
            .parse()
            .expect("uri");
        assert_eq!(manifest_from_query(&query_pairs(&uri)).expect("parses"), m);
        let bad: http::Uri = "/v1/scripts/x?service=auth".parse().expect("uri");
        assert!(manifest_from_query(&query_pairs(&bad)).is_err());
    }

    #[test]
    fn vars_travel_as_query_parameters_and_secrets_show_as_names() {
        let m =
            Manifest::from_toml("[vars]\nAPI_BASE = \"https://a.example/?x=1&y=2\"\nE = \"\"\n")
                .expect("manifest");
        let uri: http::Uri = format!("/v1/scripts/x?{}", manifest_query(&m))
            .parse()
            .expect("uri");
        assert_eq!(manifest_from_query(&query_pairs(&uri)).expect("parses"), m);
        let mut v = serde_json::json!([{ "meta": { "secrets": { "K": "abcdef" } } }]);
        names_only(&mut v);
        assert_eq!(v, serde_json::json!([{ "meta": { "secrets": ["K"] } }]));
    }

    #[test]
    fn query_parameters_are_percent_decoded() {
        let uri: http::Uri = "/v1/scripts/x?plan=paid&service=auth%3Aauth-worker&tail=my%20tail"
            .parse()
            .expect("uri");
        let m = manifest_from_query(&query_pairs(&uri)).expect("parses");
        assert_eq!(
            m.bindings.services.get("auth").map(String::as_str),
            Some("auth-worker")
        );
        assert_eq!(m.bindings.tail, ["my tail"]);
        let uri: http::Uri = "/v1/ring?script=a%2Fb%26c".parse().expect("uri");
        assert_eq!(query_param(&query_pairs(&uri), "script"), Some("a/b&c"));
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for v in ["Bearer abc", "bearer abc", "BEARER abc", "Bearer  abc"] {
            assert_eq!(bearer_token(v), Some("abc"), "{v}");
        }
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearerabc"), None);
    }
}
