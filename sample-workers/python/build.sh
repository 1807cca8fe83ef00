#!/usr/bin/env bash
# Builds the Python sample Worker (app.py) into a wasi:http proxy component.
#
#   ./build.sh OUT.wasm
#
# Uses componentize-py $COMPONENTIZE_PY_VERSION: the one on PATH if it is that
# exact version, else the one in a venv under the cache dir
# ($HEARTH_CACHE_DIR, default ${XDG_CACHE_HOME:-~/.cache}/hearth), which is
# created (pip install componentize-py==$COMPONENTIZE_PY_VERSION) if missing.
# The world is `python-worker` in ../wit/ (= wasi:http/proxy@0.2.10, WIT
# vendored in ../wit/deps, shared with the JS sample); componentize-py
# generates the Python bindings itself, so none are kept in the repo.
set -euo pipefail

COMPONENTIZE_PY_VERSION=0.25.1

if [ $# -ne 1 ]; then
    echo "usage: $0 OUT.wasm" >&2
    exit 2
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="$1"
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac

version_of() { "$1" --version 2>/dev/null | awk '{print $2}'; }

cpy=""
if command -v componentize-py >/dev/null 2>&1 &&
    [ "$(version_of componentize-py)" = "$COMPONENTIZE_PY_VERSION" ]; then
    cpy="$(command -v componentize-py)"
else
    cache="${HEARTH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hearth}"
    venv="$cache/componentize-py-$COMPONENTIZE_PY_VERSION"
    cpy="$venv/bin/componentize-py"
    if [ ! -x "$cpy" ] || [ "$(version_of "$cpy")" != "$COMPONENTIZE_PY_VERSION" ]; then
        echo "build.sh: installing componentize-py==$COMPONENTIZE_PY_VERSION into $venv" >&2
        rm -rf "$venv"
        mkdir -p "$cache"
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet "componentize-py==$COMPONENTIZE_PY_VERSION"
    fi
fi

mkdir -p "$(dirname "$out")"
start=$(date +%s)
# -p "$here": only app.py's directory is on the Python path (plus the
# bundled standard library).
(cd "$here" && "$cpy" --quiet -d ../wit -w python-worker componentize -p "$here" app -o "$out")
echo "build.sh: wrote $out ($(wc -c <"$out") bytes) in $(($(date +%s) - start)) s" >&2
