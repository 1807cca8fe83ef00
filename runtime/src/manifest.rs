//! A Worker's [`Manifest`]: the settings a deploy carries besides the
//! component itself (its plan, its [lifecycle](crate::lifecycle), its
//! [bindings](crate::bindings)).
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
//! Bindings (see [`crate::bindings`]):
//!
//! ```toml
//! outbound = "egress"            # intercepts the dispatched user Workers' subrequests
//! tail = ["traces"]              # receive each flow's trace events
//! [services]                     # http://auth.internal/ -> Worker auth-worker
//! auth = "auth-worker"
//! [dispatch]                     # http://user-a.users.dispatch.internal/
//! users = ["user-a", "user-b"]
//! ```

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::bindings::Bindings;
use crate::lifecycle::Lifecycle;
use crate::limits::Plan;

/// The deploy-time settings of a Worker.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Manifest {
    /// The plan whose limits apply (default free).
    pub plan: Plan,
    /// Whether instances are reused across requests (default auto).
    pub lifecycle: Lifecycle,
    /// Service bindings: name → script ID.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub services: BTreeMap<String, String>,
    /// Dispatch namespaces: name → the user Workers in it.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub dispatch: BTreeMap<String, BTreeSet<String>>,
    /// The outbound Worker of the user Workers this Worker dispatches to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outbound: Option<String>,
    /// Tail Workers of the flows this Worker starts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tail: Vec<String>,
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

    /// The bindings this manifest deploys.
    pub fn bindings(&self) -> Bindings {
        Bindings {
            services: self.services.clone(),
            dispatch: self.dispatch.clone(),
            outbound: self.outbound.clone(),
            tail: self.tail.clone(),
        }
    }

    /// Sets the bindings this manifest deploys.
    pub fn set_bindings(&mut self, b: Bindings) {
        self.services = b.services;
        self.dispatch = b.dispatch;
        self.outbound = b.outbound;
        self.tail = b.tail;
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
    fn bindings_are_read_from_the_manifest() {
        let m = Manifest::from_toml(
            "outbound = \"egress\"\ntail = [\"traces\"]\n[services]\nauth = \"auth-worker\"\n\
             [dispatch]\nusers = [\"user-a\", \"user-b\"]\n",
        )
        .expect("manifest");
        let b = m.bindings();
        assert_eq!(b.services["auth"], "auth-worker");
        assert_eq!(b.dispatch["users"].len(), 2);
        assert_eq!(b.outbound.as_deref(), Some("egress"));
        assert_eq!(b.tail, vec!["traces".to_string()]);
        let back = Manifest::from_toml(&toml::to_string(&m).expect("writes")).expect("reads");
        assert_eq!(back, m);
    }
}
