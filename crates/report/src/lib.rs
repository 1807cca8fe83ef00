//! # hearth-report
//!
//! What hearth's tools print, defined once: the latency summary of a set
//! of requests ([`latency::Distribution`], percentiles from an HDR
//! histogram, the field's standard) and the markdown table every tool
//! prints its results in ([`table::Table`]). `hearth demo`, `hearth bench`
//! and `hearth simulate` use both, so a "p50 / p99" or a row means the same
//! in each.
//!
//! ```
//! use hearth_report::latency::Distribution;
//! use hearth_report::table::{Align, Table};
//!
//! let d = Distribution::of(&[0.4, 0.5, 0.6, 2.0]);
//! let mut t = Table::new(["measure", "value"]).align([Align::Left, Align::Right]);
//! t.row(["requests", &d.count.to_string()]);
//! t.row(["p50 / p99 (ms)", &d.p50_p99()]);
//! assert_eq!(
//!     t.to_string(),
//!     "| measure | value |\n|---|---:|\n| requests | 4 |\n| p50 / p99 (ms) | 0.50 / 2.00 |\n"
//! );
//! ```

pub mod latency;
pub mod table;
