//! Fuzz targets for what a peer can put in a Cap'n Proto message: request
//! and response heads, context stacks and trace-event batches.
//!
//! Each case builds a message from arbitrary content (including methods,
//! URIs, header names and values no HTTP library would produce), serializes
//! it, then overwrites random bytes and may cut it short, and decodes the
//! result with the functions the shard server and client use. Decoding must
//! give a value or a typed error, never panic or allocate past the limits,
//! and an untouched message must round-trip. Proptest on the stable
//! toolchain; a long run is
//! `PROPTEST_CASES=100000 cargo test --release -p hearth-sharding fuzz_`.

use capnp::message::{Builder, ReaderOptions};
use proptest::prelude::*;

use crate::context_stack::{
    ContextFrame, ContextStack, LimitOverrides, OutboundWorkerConfig, TailWorkerConfig, TraceEvent,
    TrustLevel, read_context, read_events, write_context, write_events,
};
use crate::http_wire::{MAX_HEADERS, is_hop_by_hop, read_request_head, read_response_head};
use crate::schema::hearth_capnp::{context_stack, report_traces, request_head, response_head};

/// Byte edits applied to a serialized message: overwrites, then maybe a cut.
#[derive(Debug, Clone)]
struct Damage {
    writes: Vec<(prop::sample::Index, u8)>,
    cut: Option<prop::sample::Index>,
}

fn damage() -> impl Strategy<Value = Damage> {
    (
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        prop::option::weighted(0.2, any::<prop::sample::Index>()),
    )
        .prop_map(|(writes, cut)| Damage { writes, cut })
}

impl Damage {
    fn is_none(&self) -> bool {
        self.writes.is_empty() && self.cut.is_none()
    }

    fn apply(&self, mut bytes: Vec<u8>) -> Vec<u8> {
        if bytes.is_empty() {
            return bytes;
        }
        for (at, value) in &self.writes {
            let i = at.index(bytes.len());
            bytes[i] = *value;
        }
        if let Some(cut) = &self.cut {
            bytes.truncate(cut.index(bytes.len()));
        }
        bytes
    }
}

/// Serializes `message`, damages it, and hands the reader (if the framing
/// survived) to `decode`.
fn through_the_wire<A: capnp::message::Allocator>(
    message: &Builder<A>,
    damage: &Damage,
    decode: impl FnOnce(&capnp::message::Reader<capnp::serialize::OwnedSegments>),
) {
    let bytes = damage.apply(capnp::serialize::write_message_to_words(message));
    // The transport's own limit on message size applies before this point;
    // the default traversal limit is the one the RPC system reads with.
    if let Ok(reader) = capnp::serialize::read_message(&mut &bytes[..], ReaderOptions::new()) {
        decode(&reader);
    }
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "\\PC{0,12}",
        "[a-z0-9/_.?=&%-]{0,24}",
        Just("GET".to_string()),
        Just("http://[::1]:80/x".to_string()),
    ]
}

fn headers() -> impl Strategy<Value = Vec<(String, Vec<u8>)>> {
    prop::collection::vec(
        (
            prop_oneof!["[a-z-]{1,12}", "\\PC{0,6}", Just("connection".to_string())],
            prop::collection::vec(any::<u8>(), 0..16),
        ),
        0..6,
    )
}

fn set_headers(
    mut list: capnp::struct_list::Builder<'_, crate::schema::hearth_capnp::header::Owned>,
    headers: &[(String, Vec<u8>)],
) {
    for (i, (name, value)) in headers.iter().enumerate() {
        let mut h = list.reborrow().get(i as u32);
        h.set_name(name.as_str());
        h.set_value(value);
    }
}

fn frame() -> impl Strategy<Value = ContextFrame> {
    (
        "[a-z0-9-]{1,16}",
        prop::option::of("[a-z0-9-]{1,8}"),
        (prop::option::of(1u64..), prop::option::of(1u64..)),
        prop_oneof![
            Just(TrustLevel::Untrusted),
            Just(TrustLevel::Standard),
            Just(TrustLevel::Platform)
        ],
        prop::collection::vec("[a-z0-9-]{1,8}", 0..3),
        prop::option::of((
            "[a-z0-9-]{1,8}",
            prop::collection::vec(("\\PC{0,6}", "\\PC{0,6}"), 0..3),
        )),
        prop::collection::vec("\\PC{0,8}", 0..3),
    )
        .prop_map(
            |(script_id, ownership_override, (cpu_ms, memory_bytes), trust, tails, out, flags)| {
                ContextFrame {
                    script_id,
                    ownership_override,
                    limits: LimitOverrides {
                        cpu_ms,
                        memory_bytes,
                    },
                    trust,
                    tail_workers: tails
                        .into_iter()
                        .map(|script_id| TailWorkerConfig { script_id })
                        .collect(),
                    outbound: out
                        .map(|(script_id, params)| OutboundWorkerConfig { script_id, params }),
                    feature_flags: flags,
                }
            },
        )
}

fn event() -> impl Strategy<Value = TraceEvent> {
    (text(), text(), any::<u64>(), text(), text()).prop_map(
        |(script_id, node, timestamp_unix_ms, kind, message)| TraceEvent {
            script_id,
            node,
            timestamp_unix_ms,
            kind,
            message,
        },
    )
}

proptest! {
    #[test]
    fn fuzz_request_heads_decode_or_fail_cleanly(
        method in text(),
        uri in text(),
        headers in headers(),
        damage in damage(),
    ) {
        let mut message = Builder::new_default();
        {
            let mut head = message.init_root::<request_head::Builder>();
            head.set_method(method.as_str());
            head.set_uri(uri.as_str());
            set_headers(head.init_headers(headers.len() as u32), &headers);
        }
        through_the_wire(&message, &damage, |reader| {
            let Ok(root) = reader.get_root::<request_head::Reader>() else { return };
            if let Ok(parts) = read_request_head(root) {
                assert!(parts.headers.len() <= MAX_HEADERS);
                if damage.is_none() {
                    assert_eq!(parts.method.as_str(), method);
                    assert!(parts.headers.len() <= headers.len());
                }
            }
        });
    }

    #[test]
    fn fuzz_response_heads_decode_or_fail_cleanly(
        status in any::<u16>(),
        headers in headers(),
        damage in damage(),
    ) {
        let mut message = Builder::new_default();
        {
            let mut head = message.init_root::<response_head::Builder>();
            head.set_status(status);
            set_headers(head.init_headers(headers.len() as u32), &headers);
        }
        through_the_wire(&message, &damage, |reader| {
            let Ok(root) = reader.get_root::<response_head::Reader>() else { return };
            let decoded = read_response_head(root);
            if damage.is_none() {
                // Exactly the statuses HTTP has are accepted, and valid
                // headers; a hop-by-hop header is dropped unread.
                let valid = (100..1000).contains(&status)
                    && headers.iter().all(|(n, v)| {
                        http::HeaderName::from_bytes(n.as_bytes()).is_ok_and(|n| {
                            is_hop_by_hop(&n) || http::HeaderValue::from_bytes(v).is_ok()
                        })
                    });
                assert_eq!(decoded.is_ok(), valid, "{status} {headers:?}: {decoded:?}");
            }
        });
    }

    #[test]
    fn fuzz_context_stacks_round_trip_or_fail_cleanly(
        frames in prop::collection::vec(frame(), 0..4),
        damage in damage(),
    ) {
        let mut stack = ContextStack::new();
        for f in frames {
            stack.push(f);
        }
        let mut message = Builder::new_default();
        write_context(&stack, message.init_root());
        through_the_wire(&message, &damage, |reader| {
            let Ok(root) = reader.get_root::<context_stack::Reader>() else { return };
            let decoded = read_context(root);
            if damage.is_none() {
                let decoded = decoded.expect("an untouched stack decodes");
                assert_eq!(decoded.frames(), stack.frames());
            }
        });
    }

    #[test]
    fn fuzz_trace_batches_round_trip_or_fail_cleanly(
        events in prop::collection::vec(event(), 0..6),
        damage in damage(),
    ) {
        let mut message = Builder::new_default();
        write_events(&events, message.init_root());
        through_the_wire(&message, &damage, |reader| {
            let Ok(root) = reader.get_root::<report_traces::report_traces_params::Reader>()
            else { return };
            let Ok(list) = root.get_events() else { return };
            let decoded = read_events(list);
            if damage.is_none() {
                assert_eq!(decoded.expect("an untouched batch decodes"), events);
            }
        });
    }
}
