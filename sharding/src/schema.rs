//! The Cap'n Proto schema of hearth's inter-node protocol
//! (`sharding/schema/hearth.capnp`), compiled to Rust by `build.rs`.
//!
//! Read the schema file for the protocol itself; this module only mounts the
//! generated code (`hearth_capnp`) so the rest of the crate can name it.

#[allow(
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used,
    missing_docs,
    unreachable_pub,
    unused_qualifications,
    unsafe_op_in_unsafe_fn,
    dead_code
)]
pub mod hearth_capnp {
    include!(concat!(env!("OUT_DIR"), "/hearth_capnp.rs"));
}
