//! Bindings: which other Workers a Worker may call, and the names it calls
//! them by.
//!
//! # The model
//!
//! A Worker reaches nothing by default. At deploy (its manifest, `hearth
//! deploy` flags, or the admin API) it may be given:
//!
//! * **service bindings**: a name → a script ID (`auth` → `auth-worker`);
//! * **dispatch namespaces**: a name → a set of *user Workers* it may pick
//!   from at run time (dynamic dispatch, as in Workers for Platforms);
//! * an **outbound Worker**: the Worker that intercepts every subrequest of
//!   the user Workers it dispatches to (it may rewrite, answer or block it);
//! * **tail Workers**: Workers that receive the trace events of each flow
//!   this Worker starts;
//! * **allowed hosts**: the origins on the network it may fetch
//!   (`https://api.example.com`, `http://*.example.com:8080`; the model is
//!   in [`crate::outbound::egress`]).
//!
//! These settings are stored with the script ([`crate::ScriptMeta`]) and
//! can change only by a deploy: nothing a guest sends at run time adds to
//! them.
//!
//! A user Worker itself is deployed with `dispatch_only = true`
//! ([`crate::store::manifest`]): then it runs only as a nested call (through the
//! namespace of a dispatch Worker that lists it), and a client that
//! addresses it directly by Host gets a 404 instead of running it as a
//! flow's (trusted) entry, as on Workers for Platforms.
//!
//! # How a Worker calls a binding
//!
//! With an ordinary `wasi:http/outgoing-handler` request (`fetch()` in JS,
//! `wstd`/`hearth-sdk` in Rust, ...), addressed to a host name in the
//! reserved `.internal` domain ([`resolve`]):
//!
//! | URL | reaches |
//! |---|---|
//! | `http://<binding>.internal/<path>` | the Worker of service binding `<binding>` |
//! | `http://<worker>.<namespace>.dispatch.internal/<path>` | user Worker `<worker>` of dispatch namespace `<namespace>` |
//! | any other host | the outbound Worker in force for this level of the flow, if any; else the origin if it is on the allow-list ([`crate::outbound::egress`]); else denied |
//!
//! The scheme (`http`/`https`) and port are ignored. A name that is not one of
//! the Worker's bindings, a Worker that is not in the namespace, and an
//! external host with no outbound Worker in force and not on the allow-list are
//! all refused with the wasi:http error code `HTTP-request-denied`, which the
//! guest reads as the error of its request. How the host carries the call (the
//! context stack, limits, the depth limit) is in [`crate::flow`] and
//! [`crate::outbound::outgoing`].

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::store::validate::valid_script_id;

/// The reserved domain under which a Worker names its bindings.
pub const INTERNAL_DOMAIN: &str = "internal";

/// The label that marks a dispatch address (`<worker>.<ns>.dispatch.internal`).
pub const DISPATCH_LABEL: &str = "dispatch";

/// Most service bindings (and, separately, dispatch namespaces) per Worker.
pub const MAX_BINDINGS: usize = 64;
/// Most user Workers per dispatch namespace.
pub const MAX_NAMESPACE_WORKERS: usize = 4096;
/// Most tail Workers per Worker.
pub const MAX_TAIL_WORKERS: usize = 8;

/// A Worker's bindings, as deployed. See the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Bindings {
    /// Service bindings: name → script ID.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub services: BTreeMap<String, String>,
    /// Dispatch namespaces: name → the user Workers in it.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub dispatch: BTreeMap<String, BTreeSet<String>>,
    /// The outbound Worker for the user Workers this Worker dispatches to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outbound: Option<String>,
    /// Tail Workers of the flows this Worker starts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tail: Vec<String>,
    /// Origins on the network it may fetch ([`crate::outbound::egress`]), as
    /// written at deploy.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_hosts: Vec<String>,
}

/// Bindings that cannot be deployed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid bindings: {0}")]
pub struct BindingsError(pub String);

impl Bindings {
    /// Whether nothing is bound.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
            && self.dispatch.is_empty()
            && self.outbound.is_none()
            && self.tail.is_empty()
            && self.allowed_hosts.is_empty()
    }

    /// Checks names, targets and counts: every name is a DNS label (it is
    /// part of a host name) and every target a valid script ID.
    pub fn validate(&self) -> Result<(), BindingsError> {
        let err = |m: String| Err(BindingsError(m));
        let label = |what: &str, s: &str| {
            if valid_script_id(s) {
                Ok(())
            } else {
                Err(BindingsError(format!(
                    "{what} {s:?} is not a DNS label (1-63 lowercase letters, digits and '-')"
                )))
            }
        };
        if self.services.len() > MAX_BINDINGS {
            return err(format!("at most {MAX_BINDINGS} service bindings"));
        }
        if self.dispatch.len() > MAX_BINDINGS {
            return err(format!("at most {MAX_BINDINGS} dispatch namespaces"));
        }
        if self.tail.len() > MAX_TAIL_WORKERS {
            return err(format!("at most {MAX_TAIL_WORKERS} tail Workers"));
        }
        for (name, target) in &self.services {
            label("service binding name", name)?;
            label("service binding target", target)?;
        }
        for (ns, workers) in &self.dispatch {
            label("dispatch namespace name", ns)?;
            if workers.len() > MAX_NAMESPACE_WORKERS {
                return err(format!(
                    "dispatch namespace {ns:?} has {} Workers (at most {MAX_NAMESPACE_WORKERS})",
                    workers.len()
                ));
            }
            for w in workers {
                label("user Worker", w)?;
            }
        }
        if let Some(o) = &self.outbound {
            label("outbound Worker", o)?;
        }
        for t in &self.tail {
            label("tail Worker", t)?;
        }
        crate::outbound::egress::AllowList::parse(&self.allowed_hosts)
            .map_err(|e| BindingsError(e.to_string()))?;
        Ok(())
    }
}

/// How a call reaches its target; decides the frame the host pushes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallKind {
    /// Through service binding `name`.
    Service(String),
    /// Into dispatch namespace `namespace` (the target is a user Worker).
    Dispatch(String),
    /// A subrequest of a user Worker, intercepted by the outbound Worker.
    Outbound,
    /// The delivery of a finished flow's trace events to a tail Worker.
    Tail,
}

/// What an outgoing request's host name means for a Worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// A Worker this Worker is bound to.
    Worker {
        /// The script ID to invoke.
        script_id: String,
        /// How it was reached.
        kind: CallKind,
    },
    /// An `.internal` name that is not one of its bindings.
    NotBound(String),
    /// A host outside `.internal`: for the outbound Worker, if any.
    External,
}

/// Resolves `host` (an authority; any port is ignored, case is not
/// significant) against `bindings`. See the module docs for the scheme.
pub fn resolve(bindings: &Bindings, host: &str) -> Resolved {
    let host = host
        .rsplit_once(':')
        .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
        .map_or(host, |(h, _)| h)
        .trim_end_matches('.')
        .to_ascii_lowercase();
    let labels: Vec<&str> = host.split('.').collect();
    match labels.as_slice() {
        [name, INTERNAL_DOMAIN] => match bindings.services.get(*name) {
            Some(target) => Resolved::Worker {
                script_id: target.clone(),
                kind: CallKind::Service((*name).to_string()),
            },
            None => Resolved::NotBound(format!("no service binding named {name:?}")),
        },
        [worker, ns, DISPATCH_LABEL, INTERNAL_DOMAIN] => match bindings.dispatch.get(*ns) {
            Some(workers) if workers.contains(*worker) => Resolved::Worker {
                script_id: (*worker).to_string(),
                kind: CallKind::Dispatch((*ns).to_string()),
            },
            Some(_) => Resolved::NotBound(format!(
                "{worker:?} is not a Worker of dispatch namespace {ns:?}"
            )),
            None => Resolved::NotBound(format!("no dispatch namespace named {ns:?}")),
        },
        [.., INTERNAL_DOMAIN] => Resolved::NotBound(format!("{host:?} names no binding")),
        _ => Resolved::External,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bindings() -> Bindings {
        Bindings {
            services: [("auth".to_string(), "auth-worker".to_string())].into(),
            dispatch: [(
                "users".to_string(),
                ["user-a".to_string()].into_iter().collect(),
            )]
            .into(),
            outbound: Some("egress".into()),
            tail: vec!["tail".into()],
            allowed_hosts: vec!["https://api.example.com".into()],
        }
    }

    #[test]
    fn internal_names_resolve_to_bindings_only() {
        let b = bindings();
        assert_eq!(
            resolve(&b, "auth.internal"),
            Resolved::Worker {
                script_id: "auth-worker".into(),
                kind: CallKind::Service("auth".into())
            }
        );
        assert_eq!(
            resolve(&b, "AUTH.Internal:8080"),
            resolve(&b, "auth.internal")
        );
        assert_eq!(
            resolve(&b, "user-a.users.dispatch.internal"),
            Resolved::Worker {
                script_id: "user-a".into(),
                kind: CallKind::Dispatch("users".into())
            }
        );
        // The target's own script ID is not a binding name.
        assert!(matches!(
            resolve(&b, "auth-worker.internal"),
            Resolved::NotBound(_)
        ));
        assert!(matches!(
            resolve(&b, "user-b.users.dispatch.internal"),
            Resolved::NotBound(_)
        ));
        assert!(matches!(
            resolve(&b, "user-a.others.dispatch.internal"),
            Resolved::NotBound(_)
        ));
        assert!(matches!(resolve(&b, "a.b.internal"), Resolved::NotBound(_)));
        assert_eq!(resolve(&b, "example.com"), Resolved::External);
        assert_eq!(resolve(&b, "auth.internal.example.com"), Resolved::External);
    }

    #[test]
    fn bindings_must_be_labels_and_bounded() {
        assert!(bindings().validate().is_ok());
        let mut b = bindings();
        b.services.insert("Bad_Name".into(), "x".into());
        assert!(b.validate().is_err());
        let mut b = bindings();
        b.tail = (0..=MAX_TAIL_WORKERS).map(|i| format!("t{i}")).collect();
        assert!(b.validate().is_err());
        let mut b = bindings();
        b.outbound = Some("".into());
        assert!(b.validate().is_err());
        let mut b = bindings();
        b.allowed_hosts.push("https://*".into());
        let err = b.validate().expect_err("a bare * is refused");
        assert!(err.to_string().contains("bare *"), "{err}");
    }
}
