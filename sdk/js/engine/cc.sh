#!/bin/sh
exec clang "$@" --target=wasm32-wasi $SPIKE_CFLAGS
