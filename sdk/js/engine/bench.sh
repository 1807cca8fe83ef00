#!/bin/bash
# The spike's bench (issue 29), kept for its per-server CPU and page-fault
# figures: the QuickJS engine (`hearth build` of the JSON echo, reused and
# fresh) against Rust hello and workerd, on one `hearth serve`, rounds
# alternating; CPU per request from /proc/PID/stat of each server
# (utime+stime), page faults from minflt. The maintained comparison is
# `cargo bench -p hearth --bench js_vs_workerd`.
#
#   sdk/js/engine/bench.sh [ROUNDS] [SECONDS]
#
# Hono too, when $OUT holds hono.mjs (the sample bundled by `hearth build
# --bundle-only`): targets qjs-hono (built here from hono.mjs) and
# workerd-hono (TARGETS="qjs-hono workerd-hono").
# HEARTH (default target/release/hearth), WORKERD (default the bench's
# ~/.cache/hearth/workerd install), OUT (default /tmp/js-engine-spike),
# HEARTH_JS_NODE_MODULES (default the JS samples' node_modules).
set -e
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
ROUNDS=${1:-3}; SECS=${2:-5}
OUT=${OUT:-/tmp/js-engine-spike}
HEARTH=${HEARTH:-$root/target/release/hearth}
WORKERD=${WORKERD:-$HOME/.cache/hearth/workerd/node_modules/@cloudflare/workerd-linux-64/bin/workerd}
samples=$root/sample-workers/workers/target/hearth-samples
mkdir -p "$OUT"; cd "$OUT"; rm -rf store
export HEARTH_JS_NODE_MODULES=${HEARTH_JS_NODE_MODULES:-$root/sample-workers/js/node_modules}
"$HEARTH" build "$here/tests/echo.js" -o spike.wasm
[ -f hono.mjs ] && "$HEARTH" build hono.mjs -o spike-hono.wasm
deploy() { "$HEARTH" deploy --store store --name "$1" --plan paid --lifecycle "$2" "$3" >/dev/null 2>&1; }
deploy qjs reuse spike.wasm
deploy qjs-fresh fresh spike.wasm
deploy hello reuse "$samples/hello.wasm"
hono=
if [ -f hono.mjs ] && [ -f spike-hono.wasm ]; then
  deploy qjs-hono reuse spike-hono.wasm
  hono=yes
fi
cp "$here/tests/echo.js" worker.mjs
cat > config.capnp <<'CAPNP'
using Workerd = import "/workerd/workerd.capnp";
const config :Workerd.Config = (
  services = [ (name = "main", worker = .worker), (name = "hono", worker = .hono) ],
  sockets = [ (name = "http", address = "127.0.0.1:18733", http = (), service = "main"),
              (name = "hono", address = "127.0.0.1:18734", http = (), service = "hono") ],
);
const worker :Workerd.Worker = (
  modules = [ (name = "worker.mjs", esModule = embed "worker.mjs") ],
  compatibilityDate = "2024-09-23",
);
const hono :Workerd.Worker = (
  modules = [ (name = "hono.mjs", esModule = embed "hono.mjs") ],
  compatibilityDate = "2024-09-23",
);
CAPNP
# Without the Hono bundle, workerd serves the JSON echo on both sockets.
[ -n "$hono" ] || cp worker.mjs hono.mjs
RUST_LOG=warn "$HEARTH" serve --listen 127.0.0.1:18731 --admin 127.0.0.1:18732 --store store >serve.log 2>&1 &
HPID=$!
"$WORKERD" serve config.capnp >workerd.log 2>&1 &
WPID=$!
trap 'kill $HPID $WPID' EXIT
sleep 5
TCK=$(getconf CLK_TCK)
cpu() { awk -v t="$TCK" '{print ($14+$15)/t}' "/proc/$1/stat"; }
flt() { awk '{print $10}' "/proc/$1/stat"; }
run() { # round name pid url host
  local b fb a fa out n
  b=$(cpu "$3"); fb=$(flt "$3")
  out=$(wrk -t1 -c32 -d"${SECS}s" --latency -H "Host: $5" "$4")
  a=$(cpu "$3"); fa=$(flt "$3")
  n=$(echo "$out" | awk '/requests in/{print $1}')
  printf '%s %-12s rps=%-9s p50=%-8s p99=%-8s non2xx=%s cpu_us/req=%.1f faults/req=%.3f\n' \
    "$1" "$2" "$(echo "$out" | awk '/Requests\/sec/{print $2}')" \
    "$(echo "$out" | awk '$1=="50%"{print $2}')" "$(echo "$out" | awk '$1=="99%"{print $2}')" \
    "$(echo "$out" | awk '/Non-2xx/{print $NF}' | grep . || echo 0)" \
    "$(echo "($a-$b)*1000000/$n" | bc -l)" "$(echo "($fa-$fb)/$n" | bc -l)"
}
targets=${TARGETS:-hello qjs qjs-fresh workerd}
for r in warm $(seq 1 "$ROUNDS"); do
  for t in $targets; do
    case $t in
      workerd) row=$(run "r$r" workerd $WPID http://127.0.0.1:18733/ localhost);;
      workerd-hono) row=$(run "r$r" workerd-hono $WPID http://127.0.0.1:18734/ localhost);;
      *) row=$(run "r$r" "$t" $HPID http://127.0.0.1:18731/ "$t.localhost");;
    esac
    [ "$r" = warm ] || echo "$row"
  done
done
