#!/usr/bin/env bash
# What a retention window costs (issue 58, ADR 0076) on the S1 workload
# (POST /increment to one hot counter actor), for one `wasmkeep dev` binary
# on a folder bucket: the counter deployed with `--retention 0` (only the
# present kept) and with `--retention 7d` (the default). For each: the
# rate, the node's CPU per request, and what the bucket holds after the
# run (bytes and objects of the actor's log, from `actor history`), then
# the bytes kept per request and per day at that rate.
#
# The client is wrk (Debian's `wrk`, installed if missing), one thread,
# CONNS keep-alive connections, for SECONDS.
#
# Usage: bench/retention.sh [SECONDS] [CONNS]   (default 10 16;
# BIN=path/to/wasmkeep to measure another build)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SECONDS_RUN="${1:-10}"
CONNS="${2:-16}"
if ! command -v wrk >/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends wrk >/dev/null
fi
BIN="${BIN:-$ROOT/target/release/wasmkeep}"
WASM="${WASMKEEP_GUESTS_DIR:-$ROOT/target/wasm}"
[ -f "$WASM/counter.wasm" ] || { echo "missing $WASM/counter.wasm: run scripts/build-guests" >&2; exit 1; }
DIR="$(mktemp -d)"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
NODE=""
cleanup() {
  [ -n "$NODE" ] && kill "$NODE" 2>/dev/null && wait "$NODE" 2>/dev/null
  rm -rf "$DIR"
}
trap cleanup EXIT
node_cpu() {
  python3 -c 'import os,sys; f=open(f"/proc/{sys.argv[1]}/stat").read().rsplit(")",1)[1].split(); print((int(f[11])+int(f[12]))/os.sysconf("SC_CLK_TCK"))' "$1"
}

echo "# $BIN, S1 (one hot actor), ${SECONDS_RUN}s at $CONNS connections (wrk), folder bucket, $(nproc) CPUs"
cat >"$DIR/post.lua" <<'LUA'
wrk.method = "POST"
LUA
printf '%-10s %10s %16s %12s %10s %12s %14s\n' retention "req/s" "node CPU us/req" "bucket MiB" objects "bytes/req" "GiB/day"
run() {
  local retention="$1"
  local port; port="$(free_port)"
  rm -rf "$DIR/bucket" "$DIR/data"
  # A class deployed before `dev` starts keeps its limits.
  "$BIN" deploy counter "$WASM/counter.wasm" --bucket "file://$DIR/bucket" \
    --data-dir "$DIR/data" --retention "$retention" >/dev/null 2>>"$DIR/cli.log"
  "$BIN" dev --bucket "file://$DIR/bucket" --listen "127.0.0.1:$port" \
    --data-dir "$DIR/data" --console off counter="$WASM/counter.wasm" >"$DIR/node-$retention.log" 2>&1 &
  NODE=$!
  local url="http://127.0.0.1:$port/bench/counter/hot/increment"
  for _ in $(seq 600); do
    curl -sf -X POST "$url" >/dev/null 2>&1 && break
    sleep 0.2
  done
  local cpu0 cpu1
  cpu0="$(node_cpu "$NODE")"
  wrk -t1 -c"$CONNS" -d"${SECONDS_RUN}s" -s "$DIR/post.lua" "$url" >"$DIR/wrk-$retention.txt"
  cpu1="$(node_cpu "$NODE")"
  kill -TERM "$NODE"; wait "$NODE" 2>/dev/null || true; NODE=""
  local t0 t1 bytes objects
  t0="$(date +%s.%N)"
  "$BIN" actor history bench/counter/hot --json --bucket "file://$DIR/bucket" >"$DIR/history.json" 2>>"$DIR/cli.log"
  t1="$(date +%s.%N)"
  read -r bytes objects < <(python3 -c 'import json,sys; h=json.load(open(sys.argv[1])); e=h["entries"]; print(sum(x["bytes"] for x in e), len(e))' "$DIR/history.json")
  echo "$retention: actor history read $objects objects in $(python3 -c "print(f'{$t1 - $t0:.2f}')") s" >>"$DIR/history-times.txt"
  python3 - "$retention" "$cpu0" "$cpu1" "$DIR/wrk-$retention.txt" "$bytes" "$objects" <<'PY'
import re, sys
label, cpu0, cpu1, out = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), open(sys.argv[4]).read()
bytes_, objects = int(sys.argv[5]), int(sys.argv[6])
n = int(re.search(r"(\d+) requests in", out).group(1))
rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
if bad:
    sys.exit(f"{label}: {bad.group(1)} answers were not 2xx")
per_req = bytes_ / n
print(f"{label:<10} {rate:10.0f} {(cpu1 - cpu0) / n * 1e6:16.1f} {bytes_ / 2**20:12.1f} {objects:10d} "
      f"{per_req:12.1f} {per_req * rate * 86400 / 2**30:14.1f}")
PY
}
run 0
run 7d
cat "$DIR/history-times.txt"
