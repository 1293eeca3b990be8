#!/usr/bin/env bash
# Counts the instructions a wasmkeep build executes per request, under
# valgrind's callgrind: a measure that repeats to within ~0.5 % where
# requests per second here swing by 15 % from run to run (the VM's speed
# drifts), so it shows CPU cuts of a few percent that req/s cannot.
#
# Each build serves the same fixed load twice, SMALL and LARGE requests
# after the same warm-up, on a tmpfs folder bucket; instructions per request
# are the difference of the two totals over the difference of the counts
# (the start-up and the warm-up cancel out).
#
# What it does not see: the kernel's work (system calls, TCP, wake-ups and
# context switches), which is a quarter of the node's time in S3; and
# callgrind runs one thread at a time, so the folder committer's and a lone
# writer's polling (ADR 0032) behave differently than at full speed. A change
# that moves work between user space and the kernel, or between tasks and
# threads, still needs bench/compare-builds.sh (ADR 0043).
#
# Usage: bench/icount.sh BIN [BIN ...]   (labelled like compare-builds.sh)
#   SCENARIOS  "s3 s1c16" (default), any of:
#              s3     ACTORS counters (default 30), uniform random, 16 clients
#              s1c16  one hot counter, 16 clients
#              s1c1   one hot counter, one client
#   SMALL, LARGE  requests of the two runs (default 500 and 2500)
#   KEEP       a folder that keeps each counted run's callgrind output, named
#              SCENARIO.BUILD.REQUESTS.out, for callgrind_annotate
#
# Needs valgrind (apt install valgrind) and the harness tools that
# bench/vs-workerd.sh sets up once (oha, actors.mjs). Each binary finds the
# guests in the target/wasm folder next to it, or in GUESTS. The node runs
# with --max-actors 32: the wasmtime instance pool's address space must fit
# in valgrind's.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
command -v valgrind >/dev/null || { echo "needs valgrind (apt install valgrind)" >&2; exit 1; }
[ $# -ge 1 ] || { echo "usage: $0 BIN [BIN ...]" >&2; exit 1; }
SCENARIOS="${SCENARIOS:-s3 s1c16}"
ACTORS="${ACTORS:-30}"
SMALL="${SMALL:-500}"
LARGE="${LARGE:-2500}"
MAX_ACTORS=32
[ "$ACTORS" -le "$MAX_ACTORS" ] || { echo "ACTORS must be at most $MAX_ACTORS" >&2; exit 1; }
[ "$LARGE" -gt "$SMALL" ] || { echo "LARGE must exceed SMALL" >&2; exit 1; }
BINS=("$@")
DATA="$(mktemp -d /dev/shm/wasmkeep-icount.XXXXXX)"
PORT=$((20000 + RANDOM % 20000))
PID=""
cleanup() {
  if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
  rm -rf "$DATA"
}
trap cleanup EXIT

# start BIN VALGRIND_ARGS...: `wasmkeep dev` under valgrind on a fresh
# folder bucket in DATA, once it answers its health check.
start() {
  local bin=$1; shift
  local guests=${GUESTS:-$(dirname "$(dirname "$bin")")/wasm}
  rm -rf "$DATA/run"; mkdir -p "$DATA/run"
  valgrind "$@" "$bin" dev --guests-dir "$guests" --bucket "file://$DATA/run" \
    --listen "127.0.0.1:$PORT" --max-actors "$MAX_ACTORS" > "$DATA/server.log" 2>&1 &
  PID=$!
  for _ in $(seq 600); do
    kill -0 "$PID" 2>/dev/null || { echo "$bin did not start under valgrind:" >&2; tail -5 "$DATA/server.log" >&2; exit 1; }
    curl -sf -o /dev/null "http://127.0.0.1:$PORT/_wasmkeep/health" && return 0
    sleep 0.2
  done
  echo "$bin did not answer under valgrind in 120 s" >&2; exit 1
}

# instructions BIN SCENARIO REQUESTS: the server's total under callgrind.
instructions() {
  local bin=$1 scenario=$2 requests=$3 out="$DATA/callgrind.out"
  rm -f "$out"
  start "$bin" --tool=callgrind --cache-sim=no --branch-sim=no --callgrind-out-file="$out"
  local base="http://127.0.0.1:$PORT/bench/counter"
  local args
  case "$scenario" in
    s3)
      node "$ACTORS_MJS" urls --base "$base" --prefix s3 --count "$ACTORS" > "$DATA/urls"
      node "$ACTORS_MJS" touch --base "$base" --prefix s3 --count "$ACTORS" --conc 16 >/dev/null
      args=(-c 16 -m POST --urls-from-file "$DATA/urls") ;;
    s1c16|s1c1)
      "$OHA" -n 100 -c 1 --no-tui -m POST "$base/alice/increment" >/dev/null
      args=(-c "${scenario#s1c}" -m POST "$base/alice/increment") ;;
    *) echo "unknown scenario $scenario" >&2; exit 1 ;;
  esac
  local ok
  ok=$("$OHA" -n "$requests" --no-tui "${args[@]}" | awk '/Success rate/ {print $3}')
  [ "$ok" = "100.00%" ] || { echo "$scenario on $bin: success rate $ok" >&2; exit 1; }
  kill -TERM "$PID"; wait "$PID" 2>/dev/null || true; PID=""
  if [ -n "${KEEP:-}" ]; then
    mkdir -p "$KEEP"; cp "$out" "$KEEP/$scenario.$(name_of "$bin").$requests.out"
  fi
  awk '/^summary:/ {print $2}' "$out"
}

# prime BIN: one start under valgrind (without counting), so that the
# compiled-component cache holds this build's guests before anything is
# counted. Under valgrind the CPU reports other features, so its compiled
# code is cached apart from the native one; compiling a guest there costs
# as many instructions as ten thousand requests.
prime() {
  start "$1" --tool=none
  kill -TERM "$PID"; wait "$PID" 2>/dev/null || true; PID=""
}

echo "instructions per request (callgrind, user space only), $SMALL and $LARGE requests" >&2
for bin in "${BINS[@]}"; do prime "$bin"; done
for scenario in $SCENARIOS; do
  for bin in "${BINS[@]}"; do
    small=$(instructions "$bin" "$scenario" "$SMALL")
    large=$(instructions "$bin" "$scenario" "$LARGE")
    per=$(( (large - small) / (LARGE - SMALL) ))
    printf '%-8s %-30s %9d instructions/request  (totals %d, %d)\n' \
      "$scenario" "$(name_of "$bin")" "$per" "$small" "$large"
  done
done
