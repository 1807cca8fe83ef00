//! Property-driven fuzzing of the parsers that read what users hand the
//! node: trace files for `hearth simulate` (CSV and Azure), node configs and
//! deploy manifests.
//! Each case is arbitrary or half-valid input; the parser must return a
//! value that keeps its invariants or a typed error, never panic.
//!
//! CI runs the default number of cases; a long run:
//! `PROPTEST_CASES=100000 cargo test --release --test it fuzz_parsers::`.

use hearth_simulate::trace::{self, TraceFormat};
use proptest::prelude::*;

/// Lines that look like trace rows often enough to get past the header.
fn trace_text() -> impl Strategy<Value = String> {
    let line = prop_oneof![
        "[0-9]{1,12}(\\.[0-9]{0,4})?,[a-z0-9-]{0,12}",
        "[ -~]{0,40}",
        "HashOwner,HashApp,HashFunction,Trigger(,[0-9]{1,3}){0,6}",
        "[a-f0-9]{2},[a-f0-9]{2},[a-f0-9]{2},http(,[0-9]{1,6}){0,6}",
    ];
    prop::collection::vec(line, 0..20).prop_map(|lines| lines.join("\n"))
}

fn check(parsed: Result<trace::Trace, trace::TraceError>) -> Result<(), TestCaseError> {
    if let Ok(t) = parsed {
        prop_assert!(
            t.events.windows(2).all(|w| w[0] <= w[1]),
            "events in time order"
        );
        prop_assert!(
            t.events
                .iter()
                .all(|e| (e.worker as usize) < t.workers.len()),
            "every event names a known Worker"
        );
    }
    Ok(())
}

proptest! {
    #[test]
    fn any_bytes_as_a_trace_parse_or_fail_cleanly(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        for format in [TraceFormat::Auto, TraceFormat::Csv, TraceFormat::Azure] {
            check(trace::parse(&bytes[..], format, 7))?;
        }
    }

    #[test]
    fn trace_like_text_parses_or_fails_cleanly(text in trace_text()) {
        for format in [TraceFormat::Auto, TraceFormat::Csv, TraceFormat::Azure] {
            check(trace::parse(text.as_bytes(), format, 7))?;
        }
    }

    #[test]
    fn any_text_as_a_node_config_parses_or_fails_cleanly(
        text in "(\\[cluster\\]\\n|\\[limits\\]\\n|[a-z_]{1,24} = (\"[ -~]{0,30}\"|[0-9]{1,20}|\\[\\])\\n){0,8}"
    ) {
        if let Ok(config) = toml::from_str::<hearth::config::NodeConfig>(&text)
            && let Some(cluster) = &config.cluster
        {
            // A key is either usable or a clear error, whatever was written.
            let _ = cluster.gossip_key();
        }
    }

    #[test]
    fn any_text_as_a_deploy_manifest_parses_or_fails_cleanly(
        text in "((plan|lifecycle|[a-z]{1,10}) = (\"(free|paid|fresh|reuse|auto|[ -~]{0,12})\"|[0-9]{1,4}|true|\\[\\])\n|\\[[a-z]{1,6}\\]\n|[ -~]{0,20}\n){0,4}"
    ) {
        if let Ok(manifest) = hearth::runtime::Manifest::from_toml(&text) {
            // What parsed writes back and reads back the same.
            let written = toml::to_string(&manifest).expect("a manifest serializes");
            let again = hearth::runtime::Manifest::from_toml(&written).expect("and reads back");
            prop_assert_eq!(again, manifest);
        }
    }
}
