//! The store: where Workers' code and records live, and what a deploy
//! checks before anything is written.
//!
//! # The model
//!
//! A deploy checks a script's bytes, cheapest first ([`validate`]), and its
//! settings ([`manifest`]), then writes its source, content-addressed by
//! blake3, and one immutable record per version ([`meta`]) to a
//! [`script_store`]: a local directory, or an S3-compatible bucket for
//! nodes that share no disk ([`s3_store`]). The current deployment is one
//! version, or several sharing the traffic during a gradual rollout
//! ([`versions`]). A Worker's vars travel in the clear in its records; its
//! secrets are records of their own, one per secret, sealed under a key
//! every node of the cluster derives, and belong to the script, not to a
//! version ([`secrets`]).
//!
//! A store is bytes under names, and may be writable by others than the
//! nodes: every record is signed and checked on every read ([`records`]),
//! as compiled code is ([`artifact`]), so a write to the store cannot
//! change what runs or read a secret.
//!
//! Compiled code is cached beside the sources, authenticated by a keyed
//! MAC, so a node loads instead of compiling ([`artifact`]). A lookup of a
//! name no Worker is deployed under is remembered for a short time, so a
//! flood of unknown names costs at most one store read each per TTL
//! ([`misses`]).
//!
//! The records every part of the store shares are in [`meta`], which
//! imports none of the others.

pub mod artifact;
pub mod manifest;
pub mod meta;
pub mod misses;
pub mod records;
pub mod s3_store;
pub mod script_store;
pub mod secrets;
pub mod validate;
pub mod versions;
