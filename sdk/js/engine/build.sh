#!/bin/sh
# Builds the engine component by hand (the host crate's build does the same). rquickjs-sys compiles QuickJS-NG's C
# sources with cc; it would download wasi-sdk 24 from GitHub (unreachable
# here), so RQUICKJS_SYS_NO_WASI_SDK=1 and Debian's clang 14 + wasi-libc
# (`apt-get install -y clang lld wasi-libc`) are used instead. clang 14 does
# not know the wasm32-wasip2 triple cc passes, so cc.sh appends
# --target=wasm32-wasi (the last --target wins).
set -e
here=$(cd "$(dirname "$0")" && pwd)
export RQUICKJS_SYS_NO_WASI_SDK=1
export CC_wasm32_wasip2="$here/cc.sh"
export AR_wasm32_wasip2=llvm-ar-14
# cc passes -O3 (the profile's opt-level)
cd "$here"
cargo build --release --target wasm32-wasip2 "$@"
ls -l target/wasm32-wasip2/release/hearth_js_engine_guest.wasm
