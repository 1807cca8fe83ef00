//! Compiles `schema/hearth.capnp` into Rust at build time.
//!
//! The Cap'n Proto compiler runs in-process as WebAssembly (`capnpc-embedded`),
//! so building needs no `capnp` binary on the machine; `capnpc` then generates
//! the Rust code into `OUT_DIR`, included by `src/schema.rs`.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=schema/hearth.capnp");
    println!("cargo:rerun-if-changed=build.rs");

    let out_dir = match std::env::var_os("OUT_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => fail("OUT_DIR is not set (build.rs must run under cargo)"),
    };

    let request = match capnpc_embedded::CompileCommand::new()
        .src_prefix("schema")
        .file("schema/hearth.capnp")
        .compile()
    {
        Ok(request) => request,
        Err(e) => fail(&format!("compiling schema/hearth.capnp: {e}")),
    };

    // The generated code names its own types by absolute path; it is mounted
    // at `crate::schema::hearth_capnp`.
    if let Err(e) = capnpc::codegen::CodeGenerationCommand::new()
        .output_directory(&out_dir)
        .default_parent_module(vec!["schema".to_string()])
        .run(&request[..])
    {
        fail(&format!("generating Rust from schema/hearth.capnp: {e}"));
    }
}

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(1);
}
