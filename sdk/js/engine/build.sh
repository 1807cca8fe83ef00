#!/bin/sh
# Builds the engine component by hand, as crates/js-engine/build.rs does in
# every cargo build of hearth (into the same target dir). The result serves
# no Worker by itself: `hearth build` (hearth_js_engine::build) snapshots it
# with one. rquickjs-sys compiles QuickJS-NG's C sources with cc; it would
# download wasi-sdk 24 from GitHub (unreachable here), so
# RQUICKJS_SYS_NO_WASI_SDK=1 and Debian's clang + wasi-libc + llvm-ar
# (`apt-get install -y clang wasi-libc llvm`) are used instead. clang 14
# does not know the wasm32-wasip2 triple cc passes, so cc.sh appends
# --target=wasm32-wasi (the last --target wins).
set -e
here=$(cd "$(dirname "$0")" && pwd)
export RQUICKJS_SYS_NO_WASI_SDK=1
export CC_wasm32_wasip2="$here/cc.sh"
export AR_wasm32_wasip2=$(command -v llvm-ar || command -v llvm-ar-14)
# cc passes -O3 (the profile's opt-level)
cd "$here"
cargo build --release --target wasm32-wasip2 "$@"
ls -l target/wasm32-wasip2/release/hearth_js_engine_guest.wasm
