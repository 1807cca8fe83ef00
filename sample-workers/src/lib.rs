//! # hearth-sample-workers
//!
//! hearth's sample Workers, built from source into real **wasi:http proxy
//! components** (`wasm32-wasip2`, exporting `wasi:http/incoming-handler@0.2.x`)
//! by this crate's build script, and where to find them.
//!
//! ## How they are built
//!
//! The Worker sources are a separate guest workspace,
//! `sample-workers/workers/` (one `cdylib` crate per Worker; most use the
//! guest SDK `sdk/`, crate `hearth-sdk`). `build.rs`:
//!
//! 1. checks that the active toolchain has the `wasm32-wasip2` standard
//!    library (`rustc --print sysroot` + `lib/rustlib/wasm32-wasip2`), and if
//!    not runs `rustup target add wasm32-wasip2 --toolchain <active>`
//!    (`RUSTUP_AUTO_INSTALL=0` means `rust-toolchain.toml`'s `targets` is not
//!    installed by itself); if that fails the build stops saying what to run;
//! 2. runs a nested `cargo build --release --target wasm32-wasip2` of the guest
//!    workspace with its own stable target dir, `sample-workers/workers/target`
//!    (so rebuilds are incremental, and never contend with the host target
//!    dir's lock), removing the outer cargo's variables that would break it
//!    (`CARGO_TARGET_DIR`, `RUSTFLAGS`, `CARGO_ENCODED_RUSTFLAGS`,
//!    `CARGO_BUILD_TARGET`, `CARGO_MAKEFLAGS`, `RUSTC_WORKSPACE_WRAPPER`,
//!    `CARGO_PROFILE_*`, `CARGO_PKG_*`, ...);
//! 3. copies each component to **`sample-workers/workers/target/hearth-samples/<name>.wasm`**
//!    ([`dir`]) and records the absolute paths for this crate.
//!
//! It reruns when a guest source, manifest or lock file, or the SDK changes,
//! or when a copied component is deleted. Nothing is checked in: tests and
//! the demo always use freshly built components.
//!
//! ## The Workers ([`NAMES`])
//!
//! | name | behaviour |
//! | --- | --- |
//! | `hello` | 200 `hello from <script-id>` (env `HEARTH_SCRIPT_ID`, else `unknown`) |
//! | `echo` | streams the request body back (4 KiB chunks, constant memory); every request header `h` comes back as `x-echo-h`; `x-echo-served` counts the requests this instance served (a global: shows reuse) |
//! | `big` | 5.5 MiB of incompressible data + 4096 generated functions (~1 MB of code); 6.9 MB raw, gzip size ~5.9 MiB; 200 with a checksum of a path-selected slice |
//! | `size-1m` | like `big`, smaller: 512 KiB of data + 1536 generated functions; ~0.99 MB raw, gzip ~0.7 MB (the ~1 MB point of the cold-start benchmark) |
//! | `size-10m` | like `big`, larger: 5.5 MiB of data + 16384 generated functions (~4 MB of code); ~9.9 MB raw, gzip ~7.5 MB (7.2 MiB) (under the paid plan's 10 MiB) |
//! | `slow-start` | burns ~1 s of CPU at instantiation (`_initialize`, see below), then 200 `ready` (with header `x-init-hash`) |
//! | `cpu-hog` | loops forever on the CPU |
//! | `mem-hog` | allocates and touches 1 MiB blocks without bound |
//! | `trap` | panics (traps) before setting a response |
//! | `wstd-hello` | a plain `wstd` component (no hearth-sdk): 200 `hello from wstd` |
//! | `relay` | a link of a chain of service bindings: calls binding `next` (or the URL in `x-relay-to`), answers `"<id> > <callee body>"` and lists the callee nodes in `x-relay-nodes`; the end of a chain (no `next`) answers `"<id>"`; a too-deep flow 508 |
//! | `dispatcher` | dynamic dispatch: `/<user>/<rest>` → user Worker `<user>` of namespace `users`; `"dispatcher > <body>"` |
//! | `user-app` | a user Worker: a subrequest to `http://api.example.com<path>` (through the outbound Worker, else denied: 403) |
//! | `egress` | an outbound Worker: `"egress saw <method> <host><path> for <caller> (<trust>)"`, 403 under `/blocked` |
//! | `body-hog` | `/greedy/<n>` or `/fill/<n>`: creates `n` outgoing requests, writes up to 2 MiB into each body, finishes it and never sends it; keeps them in a global (parks host memory in body buffers) |
//! | `fan-out` | `/<n>?ms=<ms>`: sends `n` requests to binding `next` (`/nap/<ms>`) before awaiting any; `"<ok> ok, <failed> failed"`. `/nap/<ms>` sleeps `ms` and answers `napped`; `?spin=<ms>` calls `/spin/<ms>` instead, which burns `ms` of CPU and answers `spun` |
//! | `fetcher` | fetches the URL in header `x-fetch`, else what follows `fetch=` in its query (an origin; reached only if the deploy allows it) `x-fetch-count` times; one line per fetch: `"<status> <body>"`, `"<3xx> location=<url>"` (redirects are not followed) or `"error <why>"` |
//! | `tail-log` | a tail Worker: keeps each `POST`ed batch of trace events in memory; `GET` answers the count, then one batch per line |
//! | `chatty` | writes `?lines=N` log lines of `?bytes=B` bytes, then calls binding `next` `?fan=F` times; `?late=MS` starts one call that ends `MS` ms after its answer (events of a traced flow, beyond its bounds and after its end) |
//! | `config-echo` | `/<NAME>`: `env=<value> config=<value>`, a var or secret read from the environment and from `wasi:config/store` (`-` if unset); `/` lists the names each holds; `?log=TEXT` prints `TEXT` to stdout first |
//! | `counter` | a Durable Object and its front Worker in one script (`hearth-sdk-objects`): as the object, `/` increments the count in its storage, `/get` reads it, `/slow` increments with a 100 ms wait between read and write, `/big?bytes=N` stores N bytes, `/whoami` and `/url` say what it runs as; as the front Worker, `/<name>/<rest>` calls object `<name>` of binding `COUNTER` (`?binding=B` another, `/id/<id>/<rest>` an ID) |
//! | `js` | JavaScript (`sample-workers/js/worker.js`, a fetch-event Worker componentized by componentize-js 0.23 / StarlingMonkey: a plain wasi:http component from another toolchain, run as it is; `hearth build` makes JS Workers with hearth's own engine instead): JSON of the request's method, path, headers and body (with `x-js-fetch: <url>`, also the result of the standard `fetch(url)`, e.g. a binding); ~12.8 MB raw, paid plan; gets fresh instances |
//! | `python` | Python (`sample-workers/python/app.py`, componentize-py 0.25): the same JSON (plus, with `?env=NAME,…`, those names from `os.environ`: its vars and secrets); ~19 MB raw (6.5 MB gzip), paid plan; reuses its instance |
//!
//! `js` and `python` are built by Node (`node build.mjs`, pinned
//! `package-lock.json`, `npm ci` on first build) and Python (`build.sh`,
//! which installs componentize-py into a venv under `~/.cache/hearth`); the
//! build stops with a message naming what to install if `node`/`npm` is
//! missing, and skips the rebuild while a blake3 stamp of their inputs
//! (`<name>.inputs`) matches. Python is optional: without `python3` and its
//! `venv` module, `python` is not built (the build warns; [`skipped`] says
//! why, and its tests skip) unless `HEARTH_REQUIRE_PYTHON=1`.
//!
//! ## Startup work (`slow-start`)
//!
//! `slow-start` burns ~1 s of CPU while the component is being
//! **instantiated**, not in its handler. It does so the standard way: its core
//! module exports `_initialize` (via `hearth_sdk::init!`, in `sdk/`), and wit-component
//! (run by `wasm-component-ld`, rustc's linker for `wasm32-wasip2`) then adds
//! a tiny core module whose `start` section calls `_initialize`, instantiated
//! last in the component. So `_initialize` runs inside wasmtime's
//! `InstancePre::instantiate_async` / `ProxyPre::instantiate_async`, before any
//! export can be called, and a host needs no hearth-specific call: it must
//! only apply its startup CPU budget (epoch deadline or fuel) *before* it
//! instantiates, and treat an interrupt/trap there as a startup failure.
//! Without `_initialize`, a Rust component runs no guest code at
//! instantiation (static constructors run lazily in the first export call).
//!
//! ## What a host must link
//!
//! Every component imports `wasi:io`, `wasi:http/types` and, through Rust's
//! std, `wasi:cli` (`environment` — which carries `HEARTH_SCRIPT_ID` —,
//! `exit`, `stdin`/`stdout`/`stderr`, `terminal-*`), all at `@0.2.12`
//! (wasmtime 48 matches them to its 0.2.x host by semver); `wstd-hello` also
//! imports `wasi:clocks/monotonic-clock` and `wasi:random/insecure-seed`. So a
//! wasmtime host needs `wasmtime_wasi::p2::add_to_linker_async` plus
//! `wasmtime_wasi_http::p2::add_only_http_to_linker_async`, not only the
//! proxy world's interfaces.
//!
//! ## Example
//!
//! ```no_run
//! let wasm = hearth_sample_workers::bytes("hello")?;
//! assert!(wasm.starts_with(b"\0asm"));
//! for name in hearth_sample_workers::NAMES {
//!     println!("{name}: {}", hearth_sample_workers::path(name).unwrap().display());
//! }
//! # Ok::<(), std::io::Error>(())
//! ```

#![warn(missing_docs)]

use std::path::Path;

include!(concat!(env!("OUT_DIR"), "/paths.rs"));

/// The absolute path of the component for the sample Worker `name`, or
/// `None` if there is no such sample.
///
/// The file exists once this crate is built (its build script builds it),
/// unless it was deleted since.
pub fn path(name: &str) -> Option<&'static Path> {
    PATHS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, p)| Path::new(*p))
}

/// The component bytes of the sample Worker `name`.
///
/// Fails with [`std::io::ErrorKind::NotFound`] for an unknown name, or with
/// the read error of the file.
pub fn bytes(name: &str) -> std::io::Result<Vec<u8>> {
    match path(name) {
        Some(p) => std::fs::read(p),
        None => Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!(
                "no sample Worker named {name:?} (known: {})",
                NAMES.join(", ")
            ),
        )),
    }
}

/// Why the sample Worker `name` was not built, if this build skipped it.
///
/// Only an optional sample is ever skipped: `python`, on a machine without
/// `python3` and its `venv` module (`HEARTH_REQUIRE_PYTHON=1` makes that a
/// build error instead, as in CI). A test that needs it returns early,
/// printing the reason, when this is `Some`.
pub fn skipped(name: &str) -> Option<&'static str> {
    SKIPPED
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, why)| *why)
}

/// The directory holding every sample component, as `<name>.wasm`:
/// `sample-workers/workers/target/hearth-samples/` (absolute).
pub fn dir() -> &'static Path {
    Path::new(DIR)
}

/// Every sample Worker as `(name, absolute path)`, in [`NAMES`] order.
pub fn all() -> impl Iterator<Item = (&'static str, &'static Path)> {
    PATHS.iter().map(|(n, p)| (*n, Path::new(*p)))
}
