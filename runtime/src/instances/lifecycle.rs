//! A Worker's *lifecycle*: whether one instance serves many requests
//! (**reuse**, like an isolate that stays up) or every request gets a
//! **fresh** instance (what `wasmtime serve` does).
//!
//! Reuse is the fast path: no instantiation per request, and a Worker's
//! globals persist between requests (caches, connection tables, counters).
//! But not every guest survives it. componentize-js (StarlingMonkey) keeps
//! the state of the request it served and returns without answering the
//! next one; a host that reused such an instance would give users errors.
//! A request that already ran can never be replayed to recover (it may have
//! had effects), so the choice has to be made *before* an instance is
//! reused, from what the component says about itself.
//!
//! ## The rule
//!
//! A user may set `lifecycle = "reuse"` or `"fresh"` at deploy (flag or
//! manifest); that is final. With `"auto"` (the default) hearth reads what
//! every toolchain writes into a component: its `producers` custom sections
//! and the names of its core modules ([`decide`]):
//!
//! 1. a toolchain known to leave request state behind
//!    ([`SINGLE_USE_TOOLCHAINS`]: componentize-js / StarlingMonkey) →
//!    **fresh**;
//! 2. else a toolchain known to run each request on a clean instance
//!    ([`REUSABLE_TOOLCHAINS`]: componentize-py, whose handler calls run on a
//!    long-lived interpreter) → **reuse**;
//! 3. else, if every core module with code names its source language and all
//!    of those are languages whose wasi:http bindings leave the instance
//!    clean after each request ([`REUSABLE_LANGUAGES`]: Rust) → **reuse**;
//!    wit-component's glue modules (no memory, no producers) are not
//!    counted;
//! 4. else (an unknown or unnamed toolchain) → **fresh**: correct for every
//!    guest, and what the reference host does. Setting `reuse` opts in.
//!
//! A Rust Worker built with `strip = true` loses its producers section and
//! so gets fresh instances; `strip = "debuginfo"` (what the samples use)
//! keeps it, or deploy with `lifecycle = "reuse"`.
//!
//! The decision and its reason are recorded with the script at deploy and
//! shown by `hearth deploy` and the admin API.
//!
//! As a last line of defence, if a *reused* instance of a Worker ever
//! returns from its handler without sending a response, the Worker is
//! switched to fresh instances on this node at once (logged and counted as
//! `reuse_demotions`), so a mislabelled toolchain costs at most one failed
//! request per node rather than every request after the first.
//!
//! A reused instance is also retired, after answering, once it holds more
//! than three quarters of its memory limit (`memory_retirements`): a guest
//! whose heap creeps up request by request gets a fresh instance before a
//! request can fail at the limit.

use serde::{Deserialize, Serialize};

/// What a user asks for at deploy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Lifecycle {
    /// Let hearth decide from the component ([`decide`]).
    #[default]
    Auto,
    /// One instance serves many requests (per the node's `ReusePolicy`).
    Reuse,
    /// A new instance for every request.
    Fresh,
}

impl Lifecycle {
    /// The lowercase name, as in manifests and flags.
    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Auto => "auto",
            Lifecycle::Reuse => "reuse",
            Lifecycle::Fresh => "fresh",
        }
    }
}

impl std::fmt::Display for Lifecycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Lifecycle {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Lifecycle::Auto),
            "reuse" => Ok(Lifecycle::Reuse),
            "fresh" => Ok(Lifecycle::Fresh),
            other => Err(format!(
                "unknown lifecycle {other:?}: expected auto, reuse or fresh"
            )),
        }
    }
}

/// The lifecycle in force for a deployed script, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LifecycleChoice {
    /// What the deploy asked for.
    pub requested: Lifecycle,
    /// What hearth runs: [`Lifecycle::Reuse`] or [`Lifecycle::Fresh`]
    /// ([`Lifecycle::Auto`] only in metadata written before lifecycles
    /// existed, resolved when the Worker loads).
    pub chosen: Lifecycle,
    /// Why, in a sentence a user can act on.
    pub reason: String,
}

impl Default for LifecycleChoice {
    /// Undecided: metadata from before lifecycles were recorded.
    fn default() -> Self {
        LifecycleChoice {
            requested: Lifecycle::Auto,
            chosen: Lifecycle::Auto,
            reason: String::new(),
        }
    }
}

impl LifecycleChoice {
    /// Whether instances may serve more than one request.
    pub fn reuses(&self) -> bool {
        self.chosen == Lifecycle::Reuse
    }
}

/// Toolchains whose instances cannot serve a second request, matched
/// case-insensitively as substrings of producer values and core module
/// names.
pub const SINGLE_USE_TOOLCHAINS: &[&str] = &[
    "componentizejs",
    "componentize-js",
    "starlingmonkey",
    "spidermonkey",
];

/// Toolchains whose instances serve request after request correctly,
/// matched like [`SINGLE_USE_TOOLCHAINS`] (componentize-py names no
/// language in its producers, but its runtime module is named after it).
pub const REUSABLE_TOOLCHAINS: &[&str] = &["componentize_py", "componentize-py"];

/// Source languages whose wasi:http guests leave an instance clean after
/// each request: Rust (a handler's state lives in locals and in the
/// resources it drops), and C (wasi-libc, which Rust's std links in, names
/// itself `C11`), matched as prefixes (`rust`, `c89`, `c11`, ...; not C++).
pub const REUSABLE_LANGUAGES: &[&str] = &["rust", "c89", "c99", "c11", "c17", "c23"];

/// What a component says about the toolchain that made it.
#[derive(Debug, Default, PartialEq, Eq)]
struct Producers {
    /// Every producer value (`field:name`) and core module name
    /// (`module:name`) seen, lowercase.
    all: Vec<String>,
    /// Per core module with code: the languages it names (maybe none).
    module_languages: Vec<Vec<String>>,
}

/// Reads the producers sections of `bytes` (a component; nested components
/// and core modules included). Unparseable sections are ignored: this is a
/// hint, validation is done elsewhere.
fn producers(bytes: &[u8]) -> Producers {
    use wasmparser::{ComponentName, KnownCustom, Parser, Payload};
    let mut out = Producers::default();
    // A stack of "inside a core module" frames: (has code, defines a
    // memory, languages).
    let mut stack: Vec<Option<(bool, bool, Vec<String>)>> = Vec::new();
    for payload in Parser::new(0).parse_all(bytes) {
        let Ok(payload) = payload else { break };
        match payload {
            Payload::ModuleSection { .. } => stack.push(Some((false, false, Vec::new()))),
            Payload::ComponentSection { .. } => stack.push(None),
            Payload::CodeSectionStart { count, .. } if count > 0 => {
                if let Some(Some(frame)) = stack.last_mut() {
                    frame.0 = true;
                }
            }
            Payload::MemorySection(r) if r.count() > 0 => {
                if let Some(Some(frame)) = stack.last_mut() {
                    frame.1 = true;
                }
            }
            Payload::End(_) => {
                // wit-component's glue (shim and fixup modules: trampolines,
                // no memory, no producers) holds no request state and is
                // not counted.
                if let Some(Some((true, memory, langs))) = stack.pop()
                    && (memory || !langs.is_empty())
                {
                    out.module_languages.push(langs);
                }
            }
            Payload::CustomSection(reader) => match reader.as_known() {
                KnownCustom::Producers(prod) => {
                    for field in prod.into_iter().flatten() {
                        let name = field.name.to_ascii_lowercase();
                        for value in field.values.into_iter().flatten() {
                            let v = value.name.to_ascii_lowercase();
                            if name == "language"
                                && let Some(Some(frame)) = stack.last_mut()
                            {
                                frame.2.push(v.clone());
                            }
                            out.all.push(format!("{name}:{v}"));
                        }
                    }
                }
                KnownCustom::ComponentName(names) => {
                    for sub in names.into_iter().flatten() {
                        if let ComponentName::CoreModules(map) = sub {
                            for naming in map.into_iter().flatten() {
                                out.all
                                    .push(format!("module:{}", naming.name.to_ascii_lowercase()));
                            }
                        }
                    }
                }
                _ => {}
            },
            _ => {}
        }
    }
    out
}

/// Decides the lifecycle of the component `bytes` when the user asked for
/// `requested` (see the module docs for the rule).
pub fn decide(requested: Lifecycle, bytes: &[u8]) -> LifecycleChoice {
    let choice = |chosen, reason: String| LifecycleChoice {
        requested,
        chosen,
        reason,
    };
    match requested {
        Lifecycle::Reuse => return choice(Lifecycle::Reuse, "set at deploy".into()),
        Lifecycle::Fresh => return choice(Lifecycle::Fresh, "set at deploy".into()),
        Lifecycle::Auto => {}
    }
    let p = producers(bytes);
    let made_with = |list: &[&str]| {
        p.all.iter().find_map(|entry| {
            let (_, value) = entry.split_once(':')?;
            list.iter()
                .any(|t| value.contains(t))
                .then_some(value.to_string())
        })
    };
    if let Some(tool) = made_with(SINGLE_USE_TOOLCHAINS) {
        return choice(
            Lifecycle::Fresh,
            format!(
                "made with {tool}, whose instances serve one request each \
                 (StarlingMonkey keeps the previous request's state)"
            ),
        );
    }
    if let Some(tool) = made_with(REUSABLE_TOOLCHAINS) {
        return choice(
            Lifecycle::Reuse,
            format!("made with {tool}, whose instances serve request after request"),
        );
    }
    let unknown: Vec<&str> = p
        .module_languages
        .iter()
        .flat_map(|langs| {
            if langs.is_empty() {
                vec!["an unnamed language"]
            } else {
                langs
                    .iter()
                    .map(String::as_str)
                    .filter(|l| !REUSABLE_LANGUAGES.iter().any(|ok| l.starts_with(ok)))
                    .collect()
            }
        })
        .collect();
    if !p.module_languages.is_empty() && unknown.is_empty() {
        let mut langs: Vec<&str> = p
            .module_languages
            .iter()
            .flatten()
            .map(String::as_str)
            .collect();
        langs.sort_unstable();
        langs.dedup();
        return choice(
            Lifecycle::Reuse,
            format!(
                "written in {}, which leaves an instance clean after each request",
                langs.join(" and ")
            ),
        );
    }
    let what = if p.module_languages.is_empty() {
        "its code names no source language".to_string()
    } else {
        let mut u = unknown;
        u.sort_unstable();
        u.dedup();
        format!("its code includes {}", u.join(", "))
    };
    choice(
        Lifecycle::Fresh,
        format!("{what}, not known to survive reuse; deploy with lifecycle = \"reuse\" to opt in"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A component with one core module carrying `producers` fields.
    fn component(fields: &str) -> Vec<u8> {
        let wat = format!(
            r#"(component
                (core module
                    (func (export "f"))
                    (@producers {fields}))
            )"#
        );
        wat::parse_str(wat).expect("wat")
    }

    #[test]
    fn explicit_choice_is_final() {
        let js = component(r#"(processed-by "ComponentizeJS" "0.23.0")"#);
        assert_eq!(decide(Lifecycle::Reuse, &js).chosen, Lifecycle::Reuse);
        let rust = component(r#"(language "Rust" "")"#);
        assert_eq!(decide(Lifecycle::Fresh, &rust).chosen, Lifecycle::Fresh);
    }

    #[test]
    fn rust_reuses_and_js_is_fresh_even_with_rust_parts() {
        let rust = component(r#"(language "Rust" "") (processed-by "rustc" "1.95.0")"#);
        let c = decide(Lifecycle::Auto, &rust);
        assert_eq!(c.chosen, Lifecycle::Reuse, "{}", c.reason);
        let js = component(r#"(language "Rust" "") (processed-by "ComponentizeJS" "0.23.0")"#);
        let c = decide(Lifecycle::Auto, &js);
        assert_eq!(c.chosen, Lifecycle::Fresh);
        assert!(c.reason.contains("componentizejs"), "{}", c.reason);
    }

    #[test]
    fn a_rust_module_with_wasi_libc_and_glue_modules_reuses() {
        // What rustc + wasm-component-ld emit for wasm32-wasip2: the main
        // module says Rust and C11 (wasi-libc) and defines the memory; the
        // shim and fixup modules are bare trampolines.
        let wasm = wat::parse_str(
            r#"(component
                (core module (memory 1) (func (export "f"))
                    (@producers (language "Rust" "") (language "C11" "")))
                (core module (table 1 funcref) (func (export "0")))
                (core module (func (export "1"))))"#,
        )
        .expect("wat");
        let c = decide(Lifecycle::Auto, &wasm);
        assert_eq!(c.chosen, Lifecycle::Reuse, "{}", c.reason);
        // C++ is not C: a stateful module in it is not known to be clean.
        let cpp = wat::parse_str(
            r#"(component (core module (memory 1) (func (export "f"))
                (@producers (language "C++" ""))))"#,
        )
        .expect("wat");
        assert_eq!(decide(Lifecycle::Auto, &cpp).chosen, Lifecycle::Fresh);
        // A module with memory and code but no producers (a stripped
        // build) is unknown: fresh.
        let stripped =
            wat::parse_str(r#"(component (core module (memory 1) (func (export "f"))))"#)
                .expect("wat");
        assert_eq!(decide(Lifecycle::Auto, &stripped).chosen, Lifecycle::Fresh);
    }

    #[test]
    fn componentize_py_is_known_by_its_runtime_module() {
        let py = wat::parse_str(
            r#"(component
                (core module $libcomponentize_py_runtime.so (func (export "f"))))"#,
        )
        .expect("wat");
        let c = decide(Lifecycle::Auto, &py);
        assert_eq!(c.chosen, Lifecycle::Reuse, "{}", c.reason);
        assert!(c.reason.contains("componentize_py"), "{}", c.reason);
    }

    #[test]
    fn unknown_or_unnamed_toolchains_get_fresh_instances() {
        let go = component(r#"(language "Go" "1.22")"#);
        let c = decide(Lifecycle::Auto, &go);
        assert_eq!(c.chosen, Lifecycle::Fresh);
        assert!(c.reason.contains("go"), "{}", c.reason);
        let bare = wat::parse_str(r#"(component (core module (memory 1) (func (export "f"))))"#)
            .expect("wat");
        assert_eq!(decide(Lifecycle::Auto, &bare).chosen, Lifecycle::Fresh);
    }

    #[test]
    fn lifecycle_parses_case_insensitively_with_a_clear_error() {
        assert_eq!("Fresh".parse::<Lifecycle>(), Ok(Lifecycle::Fresh));
        let err = "sometimes".parse::<Lifecycle>().unwrap_err();
        assert!(err.contains("auto, reuse or fresh"), "{err}");
    }
}
