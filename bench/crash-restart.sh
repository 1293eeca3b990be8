#!/usr/bin/env bash
# Time to the first answer after a kill -9 under load (ADR 0034): one actor
# at c=16 for 2 s, SIGKILL, restart on the same folder, and the milliseconds
# from the restart's spawn to its first 200 (the peer benchmark's "restart
# after SIGKILL" row, on its own). Prints how many young objects the
# restart's recovery applied or adopted (ADR 0040).
#
# Usage: bench/crash-restart.sh BIN [BIN ...]   (runs each BIN in turn)
#   DATA    folder for the bucket (its b/ is replaced; default: a temporary
#           folder in bench-results/, removed at the end)
#   ACTORS  actors touched once each (16 at a time) before the load, as the
#           peer benchmark's S3 leaves 1,000 just activated when it kills
#           (default 0)
#   Needs oha from the harness that bench/vs-workerd.sh sets up once.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OHA="$ROOT/bench-results/harness/tools/oha/bin/oha"
[ -x "$OHA" ] || { echo "run bench/vs-workerd.sh once first (it sets up oha)" >&2; exit 1; }
[ $# -ge 1 ] || { echo "usage: $0 BIN [BIN ...]" >&2; exit 1; }
mkdir -p "$ROOT/bench-results"
if [ -n "${DATA:-}" ]; then mkdir -p "$DATA"; OWN_DATA=""; else
  DATA="$(mktemp -d "$ROOT/bench-results/crash.XXXXXX")"; OWN_DATA="$DATA"; fi
PORT="${PORT:-28777}"
URL="http://127.0.0.1:$PORT/bench/counter/crash/increment"
for BIN in "$@"; do
  GUESTS="${GUESTS:-$(dirname "$(dirname "$BIN")")/wasm}"
  rm -rf "$DATA/b"; : > "$DATA/log"
  start() { "$BIN" dev --guests-dir "$GUESTS" --bucket "file://$DATA/b" --listen "127.0.0.1:$PORT" >> "$DATA/log" 2>&1 & P=$!; }
  start
  for _ in $(seq 200); do curl -sf -o /dev/null "http://127.0.0.1:$PORT/_wasmkeep/health" && break; sleep 0.05; done
  if [ "${ACTORS:-0}" -gt 0 ]; then
    seq "$ACTORS" | xargs -P 16 -I{} curl -sf -o /dev/null -X POST \
      "http://127.0.0.1:$PORT/bench/counter/crash-{}/increment"
  fi
  "$OHA" -z 4s --no-tui -c 16 -m POST "$URL" > /dev/null 2>&1 &
  LOAD=$!
  sleep 2; kill -9 "$P"; wait "$P" 2>/dev/null || true; wait "$LOAD" 2>/dev/null || true
  t0=$(date +%s%N); start
  until curl -sf -o /dev/null -X POST "$URL"; do sleep 0.005; done
  t1=$(date +%s%N)
  applied=$(grep -o 'objects=[0-9]*' "$DATA/log" | tail -1 || true)
  adopted=$(grep -o 'adopted=[0-9]*' "$DATA/log" | tail -1 || true)
  echo "$BIN: first 200 $(( (t1 - t0) / 1000000 )) ms after the restart ${applied:+($applied applied)}${adopted:+ ($adopted)}"
  kill "$P"; wait "$P" 2>/dev/null || true
done
[ -n "$OWN_DATA" ] && rm -rf "$OWN_DATA"
