#!/usr/bin/env bash
# The developer loop's figures (issue 55): the Rust and TypeScript
# examples side by side on one `wasmkeep dev` node (folder bucket), then
# `wasmkeep new` and `dev --watch` for each language.
#
#  1. component sizes (counter, counter-js, chat, chat-js);
#  2. cold start: the time to the first answer of a new actor (a POST
#     /increment to an actor nobody touched), RUNS actors per class, p50
#     and p90 (curl's time_total, one process per request);
#  3. req/s on one hot actor per class (wrk, one thread, 16 connections,
#     SECONDS);
#  4. `wasmkeep new` to a first answered request: new, then `dev --watch`
#     on the project until its actor answers (the first build included);
#  5. a saved change to the new version serving under `dev --watch`: a
#     route added to the source, then polled until it answers.
#
# Needs scripts/build-guests --js (the JS examples and sdk/js built). The
# Rust project builds in examples/target, as the scaffold test does.
#
# Usage: bench/devloop.sh [RUNS] [SECONDS]   (default 20 5;
# BIN=path/to/wasmkeep to measure another build)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
RUNS="${1:-20}"
SECONDS_RUN="${2:-5}"
BIN="${BIN:-$ROOT/target/release/wasmkeep}"
WASM="${WASMKEEP_GUESTS_DIR:-$ROOT/target/wasm}"
for g in counter counter-js chat chat-js; do
  [ -f "$WASM/$g.wasm" ] || { echo "missing $WASM/$g.wasm: run scripts/build-guests --js" >&2; exit 1; }
done
if ! command -v wrk >/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends wrk >/dev/null
fi
DIR="$(mktemp -d)"
NODE=""
cleanup() {
  [ -n "$NODE" ] && kill "$NODE" 2>/dev/null && wait "$NODE" 2>/dev/null
  rm -rf "$DIR"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
stats() { # label, then one number (ms) per line on stdin
  python3 -c '
import sys
xs = sorted(float(l) for l in sys.stdin if l.strip())
p = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]
print(f"{sys.argv[1]:<44} p50 {p(0.5):8.1f} ms  p90 {p(0.9):8.1f} ms  ({len(xs)} runs)")' "$1"
}
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }

echo "# $BIN, $(nproc) CPUs"
echo "## component sizes"
for g in counter counter-js chat chat-js; do
  printf '%-12s %12s bytes\n' "$g" "$(stat -c %s "$WASM/$g.wasm")"
done

echo "## one node, both languages"
PORT="$(free_port)"
"$BIN" dev --bucket "file://$DIR/bucket" --listen "127.0.0.1:$PORT" --data-dir "$DIR/data" \
  --console off counter="$WASM/counter.wasm" counterjs="$WASM/counter-js.wasm" >"$DIR/node.log" 2>&1 &
NODE=$!
BASE="http://127.0.0.1:$PORT"
for class in counter counterjs; do
  for _ in $(seq 900); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' -X POST "$BASE/bench/$class/warm/increment")" = 200 ] && break
    sleep 0.2
  done
done
cat >"$DIR/post.lua" <<'LUA'
wrk.method = "POST"
LUA
for class in counter counterjs; do
  for i in $(seq "$RUNS"); do
    curl -s -o /dev/null -w '%{time_total}\n' -X POST "$BASE/bench/$class/cold-$i/increment" \
      | awk '{print $1 * 1000}'
  done | stats "cold start, $class"
done
for class in counter counterjs; do
  wrk -t1 -c16 -d"${SECONDS_RUN}s" -s "$DIR/post.lua" "$BASE/bench/$class/hot/increment" >"$DIR/wrk-$class.txt"
  if grep -q "Non-2xx" "$DIR/wrk-$class.txt"; then
    echo "$class: answers that were not 2xx" >&2; cat "$DIR/wrk-$class.txt" >&2; exit 1
  fi
  printf '%-44s %s req/s\n' "hot actor, $class (16 connections)" \
    "$(awk '/Requests\/sec/ {printf "%.0f", $2}' "$DIR/wrk-$class.txt")"
done
kill "$NODE"; wait "$NODE" 2>/dev/null || true; NODE=""

echo "## wasmkeep new, then dev --watch"
change_rust() {
  python3 - "$1/src/lib.rs" <<'PY'
import sys
p = sys.argv[1]; s = open(p).read()
t = s.replace('.get("/value", Counter::value);', '.get("/value", Counter::value)\n            .get("/hello", |_, _, _| "hello");')
assert t != s, "the Rust template changed: update bench/devloop.sh"
open(p, "w").write(t)
PY
}
change_ts() {
  python3 - "$1/src/actor.ts" <<'PY'
import re, sys
p = sys.argv[1]; s = open(p).read()
t = re.sub(r"(\.get\('/value',)", ".get('/hello', () => 'hello')\n  \\1", s, count=1)
assert t != s, "the TypeScript template changed: update bench/devloop.sh"
open(p, "w").write(t)
PY
}
for lang in rust ts; do
  name="loop-$lang"
  t0="$(now)"
  (cd "$DIR" && "$BIN" new "$name" --lang "$lang" --sdk "$ROOT" >/dev/null 2>&1)
  if [ "$lang" = ts ]; then
    (cd "$DIR/$name" && npm install --no-audit --no-fund --loglevel=error >/dev/null)
  fi
  PORT="$(free_port)"
  CARGO_TARGET_DIR="$ROOT/examples/target" "$BIN" dev --bucket "file://$DIR/bucket-$lang" \
    --listen "127.0.0.1:$PORT" --data-dir "$DIR/data-$lang" --console off --heartbeat 200ms \
    --watch "$DIR/$name" >"$DIR/node-$lang.log" 2>&1 &
  NODE=$!
  url="http://127.0.0.1:$PORT/demo/$name/a"
  for _ in $(seq 3000); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' -X POST "$url/increment")" = 200 ] && break
    sleep 0.1
  done
  echo "$lang: wasmkeep new to a first answered request: $(since "$t0") s"
  t1="$(now)"
  "change_$lang" "$DIR/$name"
  for _ in $(seq 3000); do
    [ "$(curl -s "$url/hello")" = hello ] && break
    sleep 0.1
  done
  echo "$lang: a saved change to the new version serving: $(since "$t1") s"
  kill "$NODE"; wait "$NODE" 2>/dev/null || true; NODE=""
done
