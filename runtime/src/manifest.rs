//! A Worker's [`Manifest`]: the settings a deploy carries besides the
//! component itself (its plan, its [lifecycle](crate::lifecycle)).
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

use serde::{Deserialize, Serialize};

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
}
