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
//!   in [`crate::outbound::egress`]);
//! * **Durable Object bindings**: a name → a class of this script or of
//!   another one (`COUNTER` → `Counter`, `ROOMS` → `Room` of `chat`), the
//!   namespace of objects the Worker may address ([`crate::objects`]).
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
//! | `http://<binding>.<id>.object.internal/<path>` | the Durable Object `<id>` of object binding `<binding>` ([`crate::objects`]) |
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

/// The label that marks a Durable Object address
/// (`<binding>.<id>.object.internal`).
pub const OBJECT_LABEL: &str = "object";

/// Most service bindings (and, separately, dispatch namespaces and Durable
/// Object bindings) per Worker.
pub const MAX_BINDINGS: usize = 64;
/// Longest class name of a Durable Object binding.
pub const MAX_CLASS_NAME: usize = 128;
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
    /// Durable Object bindings: name → the class (of this script or
    /// another) whose objects it addresses ([`crate::objects`]).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub durable_objects: BTreeMap<String, ObjectBinding>,
}

/// The namespace a Durable Object binding names: a class, exported by this
/// script (written as the bare class name, `COUNTER = "Counter"`) or by
/// another script (`ROOMS = { class = "Room", script = "chat" }`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ObjectBinding {
    /// A class of the script that has the binding.
    Class(String),
    /// A class of another script.
    Script(ObjectClassRef),
}

/// A class of a named script (the long form of an [`ObjectBinding`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectClassRef {
    /// The class.
    pub class: String,
    /// The script that exports it.
    pub script: String,
}

impl ObjectBinding {
    /// A binding to `class` of `script`, or of the binding's own script when
    /// `script` is `None`.
    pub fn new(class: &str, script: Option<&str>) -> Self {
        match script {
            Some(script) => ObjectBinding::Script(ObjectClassRef {
                class: class.to_string(),
                script: script.to_string(),
            }),
            None => ObjectBinding::Class(class.to_string()),
        }
    }

    /// The class.
    pub fn class(&self) -> &str {
        match self {
            ObjectBinding::Class(c) => c,
            ObjectBinding::Script(r) => &r.class,
        }
    }

    /// The script exporting the class, if it is not the binding's own.
    pub fn script(&self) -> Option<&str> {
        match self {
            ObjectBinding::Class(_) => None,
            ObjectBinding::Script(r) => Some(&r.script),
        }
    }

    /// The script exporting the class, for a binding of `owner`.
    pub fn script_or<'a>(&'a self, owner: &'a str) -> &'a str {
        self.script().unwrap_or(owner)
    }
}

impl std::fmt::Display for ObjectBinding {
    /// `Class`, or `Class@script` (the form `hearth deploy` takes).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ObjectBinding::Class(c) => f.write_str(c),
            ObjectBinding::Script(r) => write!(f, "{}@{}", r.class, r.script),
        }
    }
}

impl std::str::FromStr for ObjectBinding {
    type Err = BindingsError;

    /// Reads `Class` or `Class@script` (checked by [`Bindings::validate`]).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('@') {
            Some((class, script)) => Ok(ObjectBinding::new(class, Some(script))),
            None => Ok(ObjectBinding::new(s, None)),
        }
    }
}

/// Whether `name` can name a Durable Object binding: 1-63 ASCII letters,
/// digits, `_` and `-` (it is a label of a host name, `COUNTER` or
/// `my_rooms`; matched without regard to case).
pub fn valid_object_binding_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Whether `class` can name a Durable Object class: a JavaScript
/// identifier in ASCII (letters, digits, `_`, `$`; not starting with a
/// digit), at most [`MAX_CLASS_NAME`] bytes.
pub fn valid_class_name(class: &str) -> bool {
    let mut bytes = class.bytes();
    class.len() <= MAX_CLASS_NAME
        && bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_' || b == b'$')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$')
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
            && self.durable_objects.is_empty()
    }

    /// The Durable Object binding called `name` (matched without regard to
    /// case, as host names are).
    pub fn object(&self, name: &str) -> Option<(&str, &ObjectBinding)> {
        self.durable_objects
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(n, b)| (n.as_str(), b))
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
        if self.durable_objects.len() > MAX_BINDINGS {
            return err(format!("at most {MAX_BINDINGS} Durable Object bindings"));
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
        let mut seen = BTreeSet::new();
        for (name, binding) in &self.durable_objects {
            if !valid_object_binding_name(name) {
                return err(format!(
                    "Durable Object binding name {name:?} is not 1-63 ASCII letters, digits, '_' and '-'"
                ));
            }
            if !seen.insert(name.to_ascii_lowercase()) {
                return err(format!(
                    "Durable Object binding names {name:?} and another differ only in case \
                     (they are host name labels, which ignore case)"
                ));
            }
            if !valid_class_name(binding.class()) {
                return err(format!(
                    "Durable Object binding {name:?}: class {:?} is not an identifier \
                     (ASCII letters, digits, '_' and '$', not starting with a digit, \
                     at most {MAX_CLASS_NAME} bytes)",
                    binding.class()
                ));
            }
            if let Some(script) = binding.script() {
                label(&format!("Durable Object binding {name:?}: script"), script)?;
            }
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
    /// To a Durable Object through object binding `binding`; the call's
    /// target is the object's ring key (`do:<script>/<class>/<id>`), which
    /// routes it to the object's home, and `script` is the script that
    /// exports its class (the callee's level runs as that script).
    Object {
        /// The binding's name.
        binding: String,
        /// The script of the object's class.
        script: String,
    },
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
    /// A Durable Object of one of its object bindings: `id` as written in
    /// the host name (checked against the namespace by the caller,
    /// [`crate::objects`]).
    Object {
        /// The binding's name, as deployed.
        binding: String,
        /// The namespace it names.
        target: ObjectBinding,
        /// The object's ID, lowercased.
        id: String,
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
        [binding, id, OBJECT_LABEL, INTERNAL_DOMAIN] => match bindings.object(binding) {
            Some((name, target)) => Resolved::Object {
                binding: name.to_string(),
                target: target.clone(),
                id: (*id).to_string(),
            },
            None => Resolved::NotBound(format!("no Durable Object binding named {binding:?}")),
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
            durable_objects: [
                ("COUNTER".to_string(), ObjectBinding::new("Counter", None)),
                (
                    "ROOMS".to_string(),
                    ObjectBinding::new("Room", Some("chat")),
                ),
            ]
            .into(),
        }
    }

    #[test]
    fn object_addresses_resolve_to_object_bindings_only() {
        let b = bindings();
        let id = "ab".repeat(32);
        assert_eq!(
            resolve(&b, &format!("counter.{id}.object.internal")),
            Resolved::Object {
                binding: "COUNTER".into(),
                target: ObjectBinding::new("Counter", None),
                id: id.clone(),
            }
        );
        let Resolved::Object { target, .. } =
            resolve(&b, &format!("Rooms.{id}.Object.Internal:80"))
        else {
            panic!("an object address");
        };
        assert_eq!(target.script_or("me"), "chat");
        assert!(matches!(
            resolve(&b, &format!("nope.{id}.object.internal")),
            Resolved::NotBound(_)
        ));
        // A service binding's name is not an object binding.
        assert!(matches!(
            resolve(&b, &format!("auth.{id}.object.internal")),
            Resolved::NotBound(_)
        ));
    }

    #[test]
    fn object_bindings_are_checked() {
        let mut b = bindings();
        b.durable_objects
            .insert("counter".into(), ObjectBinding::new("Counter", None));
        let err = b.validate().expect_err("case-insensitive duplicate");
        assert!(err.to_string().contains("case"), "{err}");
        let mut b = bindings();
        b.durable_objects
            .insert("X".into(), ObjectBinding::new("9Lives", None));
        assert!(
            b.validate()
                .expect_err("bad class")
                .to_string()
                .contains("identifier")
        );
        let mut b = bindings();
        b.durable_objects
            .insert("X".into(), ObjectBinding::new("C", Some("Bad Script")));
        assert!(b.validate().is_err());
        let mut b = bindings();
        b.durable_objects
            .insert("a.b".into(), ObjectBinding::new("C", None));
        assert!(b.validate().is_err());
        let mut b = bindings();
        b.durable_objects = (0..=MAX_BINDINGS)
            .map(|i| (format!("B{i}"), ObjectBinding::new("C", None)))
            .collect();
        assert!(
            b.validate()
                .expect_err("too many")
                .to_string()
                .contains("at most")
        );
        assert_eq!(
            "Room@chat".parse::<ObjectBinding>().expect("parses"),
            ObjectBinding::new("Room", Some("chat"))
        );
        assert_eq!(
            ObjectBinding::new("Room", Some("chat")).to_string(),
            "Room@chat"
        );
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
