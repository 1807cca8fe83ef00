//! Deploy-time checks on a script's bytes, cheapest first: its compressed
//! size against the plan, then that it is a component exporting
//! `wasi:http/incoming-handler`. Compiling (in [`crate::Runtime::deploy`])
//! then catches everything else with wasmtime's own message.

use std::io::Write;

/// The interface a Worker must export to serve HTTP (any 0.2.x version).
pub const HANDLER_EXPORT: &str = "wasi:http/incoming-handler@0.2";

/// Size of `bytes` after gzip at level 6, the measure the size limit uses
/// (a 13 MB JS component is about 4 MB by this measure). Streams through a
/// counter, so it allocates nothing proportional to the input.
pub fn compressed_size(bytes: &[u8]) -> u64 {
    struct Count(u64);
    impl Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut enc = flate2::write::GzEncoder::new(Count(0), flate2::Compression::new(6));
    // Writing to a counter cannot fail.
    let _ = enc.write_all(bytes);
    enc.finish().map(|c| c.0).unwrap_or(u64::MAX)
}

/// Checks that `bytes` is a component exporting the HTTP handler, and
/// returns the names of its top-level exports.
pub fn validate_component(bytes: &[u8]) -> Result<Vec<String>, ValidationError> {
    if !bytes.starts_with(b"\0asm") {
        return Err(ValidationError::NotWasm);
    }
    if wasmparser::Parser::is_core_wasm(bytes) {
        return Err(ValidationError::CoreModule);
    }
    if !wasmparser::Parser::is_component(bytes) {
        return Err(ValidationError::Malformed(
            "unknown WebAssembly binary version or layer".into(),
        ));
    }
    let mut exports = Vec::new();
    let mut depth = 0usize;
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| ValidationError::Malformed(e.to_string()))?;
        match payload {
            wasmparser::Payload::ModuleSection { .. }
            | wasmparser::Payload::ComponentSection { .. } => depth += 1,
            wasmparser::Payload::End(_) => depth = depth.saturating_sub(1),
            wasmparser::Payload::ComponentExportSection(reader) if depth == 0 => {
                for export in reader {
                    let export = export.map_err(|e| ValidationError::Malformed(e.to_string()))?;
                    exports.push(export.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    if !exports.iter().any(|e| e.starts_with(HANDLER_EXPORT)) {
        return Err(ValidationError::MissingHandler(exports));
    }
    Ok(exports)
}

/// Checks a script ID is a DNS label, so it can be routed by the first label
/// of a Host header (`hello.example.com` -> `hello`).
pub fn valid_script_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 63
        && !id.starts_with('-')
        && !id.ends_with('-')
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Why bytes are not a Worker: a wasi:http proxy component.
#[derive(Debug, thiserror::Error)]
pub enum ValidationError {
    /// Not WebAssembly at all.
    #[error("not a WebAssembly binary (missing the \\0asm magic header)")]
    NotWasm,
    /// A core module was given where a component is needed.
    #[error(
        "this is a core WebAssembly module, not a component: build the Worker for wasm32-wasip2 (or wrap it with `wasm-tools component new`)"
    )]
    CoreModule,
    /// The binary does not parse.
    #[error("malformed component: {0}")]
    Malformed(String),
    /// The component does not export the HTTP handler.
    #[error(
        "component does not export wasi:http/incoming-handler@0.2.x, so it cannot serve HTTP; its exports are: [{}]",
        .0.join(", ")
    )]
    MissingHandler(Vec<String>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_module_is_named_as_such() {
        let module = wat::parse_str("(module)").expect("valid wat");
        assert!(matches!(
            validate_component(&module),
            Err(ValidationError::CoreModule)
        ));
    }

    #[test]
    fn component_without_handler_lists_its_exports() {
        let c = wat::parse_str(r#"(component (import "f" (func $f)) (export "greet" (func $f)))"#)
            .expect("wat");
        match validate_component(&c) {
            Err(ValidationError::MissingHandler(names)) => assert_eq!(names, vec!["greet"]),
            other => panic!("expected MissingHandler, got {other:?}"),
        }
    }

    #[test]
    fn garbage_and_truncation_are_rejected_with_parser_message() {
        assert!(matches!(
            validate_component(b"hello world"),
            Err(ValidationError::NotWasm)
        ));
        let mut c = wat::parse_str("(component (core module))").expect("wat");
        c.truncate(c.len() - 3);
        match validate_component(&c) {
            Err(ValidationError::Malformed(msg)) => assert!(!msg.is_empty()),
            other => panic!("expected Malformed, got {other:?}"),
        }
    }

    #[test]
    fn compressed_size_measures_gzip() {
        let zeros = vec![0u8; 1 << 20];
        let small = compressed_size(&zeros);
        assert!(small < 10_000, "1 MiB of zeros compresses well: {small}");
        let noise: Vec<u8> = (0..1u32 << 20)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        assert!(compressed_size(&noise) > small);
    }

    #[test]
    fn script_ids_are_dns_labels() {
        assert!(valid_script_id("hello"));
        assert!(valid_script_id("a-1"));
        for bad in ["", "-a", "a-", "Hello", "a.b", "a_b", &"x".repeat(64)] {
            assert!(!valid_script_id(bad), "{bad:?}");
        }
    }
}
