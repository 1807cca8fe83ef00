//! Cold start phases and how they are reported.
//!
//! A cold start has four phases: *fetch* (read the source from the script
//! store), *compile* (or load a precompiled artifact), *instantiate*
//! (including start functions and top-level init, under the startup CPU
//! budget) and the *handler* (the first invocation, until the response head).
//! A warm request runs only the handler, or instantiate + handler when it
//! needs a new instance of a warm Worker. Each response carries the phases
//! that ran as a `server-timing` header and `x-hearth-start: cold|warm`, or
//! `prewarmed` for the first request to a Worker that a prewarm (from a TLS
//! ClientHello's SNI) loaded and instantiated ahead of it.

use std::fmt::Write;
use std::time::Duration;

use serde::Serialize;

/// Response header naming whether the Worker was cold or warm.
pub const START_HEADER: &str = "x-hearth-start";
/// The standard Server-Timing response header.
pub const SERVER_TIMING_HEADER: &str = "server-timing";

/// Whether a request found its Worker warm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Start {
    /// The Worker was not resident: it was fetched and compiled (or loaded).
    Cold,
    /// The Worker was resident.
    Warm,
    /// The Worker was loaded by a prewarm, not by a request, and this is
    /// the first request to use it: no fetch or compile phase ran for it.
    Prewarmed,
}

impl Start {
    /// `cold`, `warm` or `prewarmed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Start::Cold => "cold",
            Start::Warm => "warm",
            Start::Prewarmed => "prewarmed",
        }
    }
}

/// Where compiled code came from on a cold start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CodeSource {
    /// Compiled from source.
    Compiled,
    /// Loaded from an authenticated precompiled artifact.
    Artifact,
}

/// The measured phases of one request; `None` for phases that did not run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Timing {
    /// Reading the source from the store.
    pub fetch: Option<Duration>,
    /// Compiling or loading the compiled component.
    pub compile: Option<Duration>,
    /// Where the compiled code came from.
    pub code_source: Option<CodeSource>,
    /// Instantiation including top-level code.
    pub instantiate: Option<Duration>,
    /// CPU time used by instantiation.
    pub startup_cpu: Option<Duration>,
    /// The handler, until the response head.
    pub handler: Option<Duration>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl Timing {
    /// The `server-timing` header value: `fetch;dur=0.12, compile;dur=…`,
    /// only the phases that ran, durations in milliseconds.
    pub fn header_value(&self) -> String {
        let mut s = String::new();
        for (name, d) in [
            ("fetch", self.fetch),
            ("compile", self.compile),
            ("instantiate", self.instantiate),
            ("handler", self.handler),
        ] {
            if let Some(d) = d {
                if !s.is_empty() {
                    s.push_str(", ");
                }
                let _ = write!(s, "{name};dur={:.3}", ms(d));
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_lists_only_phases_that_ran() {
        let t = Timing {
            instantiate: Some(Duration::from_micros(1500)),
            handler: Some(Duration::from_micros(250)),
            ..Timing::default()
        };
        assert_eq!(t.header_value(), "instantiate;dur=1.500, handler;dur=0.250");
    }
}
