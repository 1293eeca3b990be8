#!/usr/bin/env bash
# From `wasmkeep new` to a first answered request (issue 55), for a Rust and
# a TypeScript project, on loopback with a folder bucket. For each language,
# in a new temporary folder: `wasmkeep new`, (`npm install` for TypeScript),
# `wasmkeep build`, start `wasmkeep dev` with the component, and POST
# /increment until it answers 200. Prints the seconds of each step, the
# component's size, and the same after a one-line change (build and a
# node started again, the compiled component not cached: a new scratch
# folder).
#
# The Rust build shares examples/target (the standard library for
# wasm32-wasip2 already built there by scripts/build-guests), as the tests
# do; RUST_TARGET_DIR=/new/dir measures a first build from nothing.
#
# Usage: bench/new-project.sh   (BIN=path/to/wasmkeep to measure another build)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${BIN:-$ROOT/target/release/wasmkeep}"
[ -x "$BIN" ] || { echo "missing $BIN: cargo build --release" >&2; exit 1; }
WORK="$(mktemp -d)"
NODE=
cleanup() { [ -n "$NODE" ] && kill "$NODE" 2>/dev/null && wait "$NODE" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
export CARGO_TARGET_DIR="${RUST_TARGET_DIR:-$ROOT/examples/target}"

now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):6.1f} s')" "$1" "$(now)"; }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Starts a node with the project's component and waits for the actor's answer.
serve() {
  local name=$1 dir=$2 p
  p=$(port)
  "$BIN" dev --listen "127.0.0.1:$p" --console off --bucket "file://$dir/.bench/bucket" \
    --data-dir "$dir/.bench/scratch-$RANDOM" "$name=$dir/$name.wasm" >/dev/null 2>"$dir/.bench.log" &
  NODE=$!
  until curl -sf -X POST "http://127.0.0.1:$p/demo/$name/a/increment" >/dev/null; do
    kill -0 "$NODE" 2>/dev/null || { cat "$dir/.bench.log" >&2; exit 1; }
    sleep 0.05
  done
  kill "$NODE"; wait "$NODE" 2>/dev/null || true; NODE=
}

echo "# $BIN, $(nproc) CPUs, Rust target dir $CARGO_TARGET_DIR"
for lang in rust ts; do
  name="bench-$lang"
  cd "$WORK"
  t=$(now); "$BIN" new "$name" --lang "$lang" 2>/dev/null; echo "$lang: new             $(since "$t")"
  cd "$name"
  if [ "$lang" = ts ]; then
    t=$(now); npm install --no-audit --no-fund --silent >/dev/null; echo "$lang: npm install     $(since "$t")"
  fi
  t=$(now); "$BIN" build . 2>/dev/null >/dev/null; echo "$lang: build           $(since "$t")"
  t=$(now); serve "$name" "$PWD"; echo "$lang: start to answer  $(since "$t")"
  echo "$lang: component       $(stat -c %s "$name.wasm") bytes"
  if [ "$lang" = rust ]; then
    sed -i 's|.get("/value", Counter::value);|.get("/value", Counter::value)\n            .get("/hello", \|_, _, _\| "hello");|' src/lib.rs
  else
    sed -i "s|.get('/value', () => String(value()));|.get('/value', () => String(value()))\n  .get('/hello', () => 'hello');|" src/actor.ts
  fi
  t=$(now); "$BIN" build . 2>/dev/null >/dev/null; serve "$name" "$PWD"
  echo "$lang: change to answer $(since "$t") (build and a node started, compiling)"
  # Under --watch: a saved change to its first answer.
  p=$(port)
  "$BIN" dev --listen "127.0.0.1:$p" --console off --heartbeat 1s --bucket "file://$PWD/.bench/watch" \
    --data-dir "$PWD/.bench/scratch-watch" --watch "$PWD" >/dev/null 2>"$PWD/.bench.watch.log" &
  NODE=$!
  until curl -sf "http://127.0.0.1:$p/demo/$name/a/hello" >/dev/null; do
    kill -0 "$NODE" 2>/dev/null || { cat "$PWD/.bench.watch.log" >&2; exit 1; }
    sleep 0.05
  done
  if [ "$lang" = rust ]; then sed -i 's|"hello")|"hello again")|' src/lib.rs; else sed -i "s|'hello')|'hello again')|" src/actor.ts; fi
  t=$(now)
  until [ "$(curl -s "http://127.0.0.1:$p/demo/$name/a/hello")" = "hello again" ]; do
    kill -0 "$NODE" 2>/dev/null || { cat "$PWD/.bench.watch.log" >&2; exit 1; }
    sleep 0.05
  done
  echo "$lang: --watch, saved change to answer $(since "$t")"
  kill "$NODE"; wait "$NODE" 2>/dev/null || true; NODE=
done
