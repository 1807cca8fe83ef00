//! A Worker's [`Manifest`]: the settings a deploy carries besides the
//! component itself (its plan, its [lifecycle](crate::instances::lifecycle), its
//! [bindings](crate::outbound::bindings)).
//!
//! On disk a manifest is a TOML file beside the `.wasm` (`hello.wasm` →
//! `hello.toml`), read by `hearth deploy`; flags override it. The admin API
//! takes the same settings as query parameters. Unknown keys are an error,
//! so a typo never silently deploys with defaults.
//!
//! ```
//! use hearth_runtime::{Lifecycle, Manifest, Plan};
//! let m = Manifest::from_toml("plan = \"paid\"\nlifecycle = \"fresh\"\n").unwrap();
//! assert_eq!(m.plan, Plan::Paid);
//! assert_eq!(m.lifecycle, Lifecycle::Fresh);
//! ```
//!
//! Bindings (see [`crate::outbound::bindings`]):
//!
//! ```toml
//! outbound = "egress"            # intercepts the dispatched user Workers' subrequests
//! tail = ["traces"]              # receive each flow's trace events
//! allowed_hosts = ["https://api.example.com", "http://*.example.com:8080"]
//!                                # origins it may fetch (crate::outbound::egress)
//! [services]                     # http://auth.internal/ -> Worker auth-worker
//! auth = "auth-worker"
//! [dispatch]                     # http://user-a.users.dispatch.internal/
//! users = ["user-a", "user-b"]
//! [durable_objects]              # http://COUNTER.<id>.object.internal/ (crate::objects)
//! COUNTER = "Counter"            # a class of this script
//! ROOMS = { class = "Room", script = "chat" }   # a class of another script
//! ```
//!
//! Vars (see [`crate::store::secrets`]; secrets are never in a manifest):
//!
//! ```toml
//! [vars]
//! API_BASE = "https://api.example.com"
//! ```
//!
//! A *user Worker* (one a platform's dispatch Worker picks, as on Workers
//! for Platforms) is deployed with `dispatch_only = true` (`hearth deploy
//! --dispatch-only`, admin API `?dispatch_only=true`): it is then served
//! only as a nested call (through its dispatcher's namespace, or any other
//! binding of a Worker that reaches it), never as a flow's entry. A client
//! that addresses it directly by Host gets a 404 on every front door and
//! on its home ([`crate::RuntimeError::DispatchOnly`]), so it can never run
//! as a trusted entry Worker.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::instances::lifecycle::Lifecycle;
use crate::limits::Plan;
use crate::outbound::bindings::Bindings;

/// The deploy-time settings of a Worker.
///
/// The bindings' keys (`services`, `dispatch`, `outbound`, `tail`) sit at
/// the top level beside `plan` and `lifecycle`, as they always have:
/// [`Bindings`] is flattened into the manifest, not a table of its own.
/// Unknown keys are still refused (serde checks what the flattened part
/// leaves over), though the message no longer lists the known ones.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Manifest {
    /// The plan whose limits apply (default free).
    pub plan: Plan,
    /// Whether instances are reused across requests (default auto).
    pub lifecycle: Lifecycle,
    /// The Workers it may call and the tail Workers of its flows.
    #[serde(flatten)]
    pub bindings: Bindings,
    /// Its vars: names and values its instances read from their
    /// environment ([`crate::store::secrets`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub vars: BTreeMap<String, String>,
    /// A user Worker: served only as a nested call (through a dispatch
    /// namespace), never to a client directly (see the module docs).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub dispatch_only: bool,
}

/// A manifest that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("invalid Worker manifest: {0}")]
pub struct ManifestError(String);

impl Manifest {
    /// Parses a manifest from TOML text.
    pub fn from_toml(text: &str) -> Result<Self, ManifestError> {
        toml::from_str(text).map_err(|e| ManifestError(e.message().to_string()))
    }
}

impl From<Plan> for Manifest {
    /// The default manifest on `plan`.
    fn from(plan: Plan) -> Self {
        Manifest {
            plan,
            ..Manifest::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_manifest_is_the_default_and_typos_are_errors() {
        assert_eq!(Manifest::from_toml("").expect("empty"), Manifest::default());
        let err = Manifest::from_toml("lifecycel = \"fresh\"").unwrap_err();
        assert!(err.to_string().contains("lifecycel"), "{err}");
        let err = Manifest::from_toml("lifecycle = \"never\"").unwrap_err();
        assert!(err.to_string().contains("never"), "{err}");
    }

    /// A manifest with every key, and how it is written back: the format
    /// `hearth deploy` reads and the admin API's JSON, fixed.
    const FULL: &str = "plan = \"paid\"\nlifecycle = \"fresh\"\noutbound = \"egress\"\n\
                        tail = [\"traces\"]\n\n[services]\nauth = \"auth-worker\"\n\n\
                        [dispatch]\nusers = [\"user-a\", \"user-b\"]\n";

    #[test]
    fn the_manifest_format_does_not_change() {
        let m = Manifest::from_toml(FULL).expect("manifest");
        assert_eq!((m.plan, m.lifecycle), (Plan::Paid, Lifecycle::Fresh));
        assert_eq!(toml::to_string(&m).expect("writes"), FULL);
        let json = serde_json::to_string(&m).expect("json");
        assert_eq!(
            json,
            "{\"plan\":\"paid\",\"lifecycle\":\"fresh\",\"services\":{\"auth\":\"auth-worker\"},\
             \"dispatch\":{\"users\":[\"user-a\",\"user-b\"]},\"outbound\":\"egress\",\"tail\":[\"traces\"]}"
        );
        assert_eq!(serde_json::from_str::<Manifest>(&json).expect("reads"), m);
        // Bindings are top-level keys, not a table of their own.
        assert!(Manifest::from_toml("[bindings]\ntail = [\"traces\"]\n").is_err());
        assert!(serde_json::from_str::<Manifest>("{\"plan\":\"paid\",\"bogus\":1}").is_err());
    }

    #[test]
    fn allowed_hosts_are_read_and_checked_at_deploy() {
        let m = Manifest::from_toml(
            "allowed_hosts = [\"https://api.example.com\", \"http://*.example.com:8080\"]\n",
        )
        .expect("manifest");
        assert_eq!(m.bindings.allowed_hosts.len(), 2);
        assert!(m.bindings.validate().is_ok());
        let back = Manifest::from_toml(&toml::to_string(&m).expect("writes")).expect("reads");
        assert_eq!(back, m);
        let bad = Manifest::from_toml("allowed_hosts = [\"https://api.example.com/v1\"]\n")
            .expect("parses; checked at deploy");
        let err = bad.bindings.validate().expect_err("a path is refused");
        assert!(err.to_string().contains("path"), "{err}");
    }

    #[test]
    fn vars_are_a_table_and_round_trip() {
        let m = Manifest::from_toml("plan = \"paid\"\n[vars]\nAPI_BASE = \"https://a.example\"\n")
            .expect("manifest");
        assert_eq!(m.vars["API_BASE"], "https://a.example");
        let back = Manifest::from_toml(&toml::to_string(&m).expect("writes")).expect("reads");
        assert_eq!(back, m);
        assert!(
            Manifest::from_toml("[vars]\nN = 1\n").is_err(),
            "values are strings"
        );
    }

    #[test]
    fn bindings_are_read_from_the_manifest() {
        let m = Manifest::from_toml(
            "outbound = \"egress\"\ntail = [\"traces\"]\n[services]\nauth = \"auth-worker\"\n\
             [dispatch]\nusers = [\"user-a\", \"user-b\"]\n",
        )
        .expect("manifest");
        let b = &m.bindings;
        assert_eq!(b.services["auth"], "auth-worker");
        assert_eq!(b.dispatch["users"].len(), 2);
        assert_eq!(b.outbound.as_deref(), Some("egress"));
        assert_eq!(b.tail, vec!["traces".to_string()]);
        let back = Manifest::from_toml(&toml::to_string(&m).expect("writes")).expect("reads");
        assert_eq!(back, m);
    }

    #[test]
    fn durable_object_bindings_are_a_table_and_round_trip() {
        use crate::outbound::bindings::ObjectBinding;
        let m = Manifest::from_toml(
            "[durable_objects]\nCOUNTER = \"Counter\"\nROOMS = { class = \"Room\", script = \"chat\" }\n",
        )
        .expect("manifest");
        let d = &m.bindings.durable_objects;
        assert_eq!(d["COUNTER"], ObjectBinding::new("Counter", None));
        assert_eq!(d["ROOMS"], ObjectBinding::new("Room", Some("chat")));
        assert!(m.bindings.validate().is_ok());
        let back = Manifest::from_toml(&toml::to_string(&m).expect("writes")).expect("reads");
        assert_eq!(back, m);
        let json = serde_json::to_string(&m).expect("json");
        assert!(
            json.contains("\"durable_objects\":{\"COUNTER\":\"Counter\",\"ROOMS\":{\"class\":\"Room\",\"script\":\"chat\"}}"),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<Manifest>(&json).expect("reads"), m);
        assert!(
            Manifest::from_toml("[durable_objects]\nX = { class = \"C\", scrpt = \"s\" }\n")
                .is_err(),
            "a typo in the long form is refused"
        );
    }

    #[test]
    fn dispatch_only_is_read_and_written_only_when_set() {
        let m = Manifest::from_toml("dispatch_only = true\n").expect("manifest");
        assert!(m.dispatch_only);
        assert_eq!(
            toml::to_string(&m).expect("writes"),
            "plan = \"free\"\nlifecycle = \"auto\"\ndispatch_only = true\n"
        );
        assert!(!Manifest::default().dispatch_only);
        assert!(
            !toml::to_string(&Manifest::default())
                .expect("writes")
                .contains("dispatch_only")
        );
    }
}
