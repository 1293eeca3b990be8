#!/usr/bin/env bash
# The cost of traces (issue 57, ADR 0072) on the S1 workload (POST
# /increment to one hot counter actor), for three runs of one `wasmkeep
# dev` binary on a folder bucket: traces off, on at 1 % sampling
# (parentbased_traceidratio 0.01), and on at 100 %. The spans go to an
# OTLP/HTTP sink in this script (Python, answering 200 to every export).
#
# The figures to read are the node's CPU time per request (user + system
# from /proc over the measured window) and the rate. The client is wrk
# (Debian's `wrk`, installed if missing), one thread, CONNS keep-alive
# connections, for SECONDS.
#
# Usage: bench/traces.sh [SECONDS] [CONNS]   (default 10 16;
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
SINK_PORT="$(free_port)"
python3 - "$SINK_PORT" "$DIR/sink.count" >"$DIR/sink.log" 2>&1 <<'PY' &
import http.server, sys
class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        with open(sys.argv[2], "a") as f:
            f.write("1\n")
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
PY
SINK=$!
NODE=""
cleanup() {
  [ -n "$NODE" ] && kill "$NODE" 2>/dev/null && wait "$NODE" 2>/dev/null
  kill "$SINK" 2>/dev/null; wait "$SINK" 2>/dev/null
  rm -rf "$DIR"
}
trap cleanup EXIT
# node_cpu PID: the process's user + system seconds so far.
node_cpu() {
  python3 -c 'import os,sys; f=open(f"/proc/{sys.argv[1]}/stat").read().rsplit(")",1)[1].split(); print((int(f[11])+int(f[12]))/os.sysconf("SC_CLK_TCK"))' "$1"
}

echo "# $BIN, S1 (one hot actor), ${SECONDS_RUN}s at $CONNS connections (wrk), $(nproc) CPUs"
cat >"$DIR/post.lua" <<'LUA'
wrk.method = "POST"
LUA
printf '%-10s %10s %16s %14s\n' traces "req/s" "node CPU us/req" "OTLP exports"
run() {
  local label="$1"; shift
  local port; port="$(free_port)"
  rm -rf "$DIR/bucket" "$DIR/data"
  : >"$DIR/sink.count"
  env "$@" "$BIN" dev --bucket "file://$DIR/bucket" --listen "127.0.0.1:$port" \
    --data-dir "$DIR/data" --console off counter="$WASM/counter.wasm" >"$DIR/node-$label.log" 2>&1 &
  NODE=$!
  local url="http://127.0.0.1:$port/bench/counter/hot/increment"
  for _ in $(seq 600); do
    curl -sf -X POST "$url" >/dev/null 2>&1 && break
    sleep 0.2
  done
  # Warm-up: the instance, the allocator, the exporter's first batches.
  wrk -t1 -c"$CONNS" -d2s -s "$DIR/post.lua" "$url" >/dev/null
  local cpu0 cpu1
  cpu0="$(node_cpu "$NODE")"
  wrk -t1 -c"$CONNS" -d"${SECONDS_RUN}s" -s "$DIR/post.lua" "$url" >"$DIR/wrk-$label.txt"
  cpu1="$(node_cpu "$NODE")"
  python3 - "$label" "$cpu0" "$cpu1" "$DIR/wrk-$label.txt" <<'PY'
import re, sys
label, cpu0, cpu1, out = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), open(sys.argv[4]).read()
n = int(re.search(r"(\d+) requests in", out).group(1))
rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
if bad:
    sys.exit(f"{label}: {bad.group(1)} answers were not 2xx")
print(f"{label:<10} {rate:10.0f} {(cpu1 - cpu0) / n * 1e6:16.1f}", end="")
PY
  kill -TERM "$NODE"; wait "$NODE" 2>/dev/null || true; NODE=""
  printf ' %14s\n' "$(grep -c . "$DIR/sink.count" || true)"
}
OTEL=(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$SINK_PORT")
run off
run "1%" "${OTEL[@]}" OTEL_TRACES_SAMPLER=parentbased_traceidratio OTEL_TRACES_SAMPLER_ARG=0.01
run "100%" "${OTEL[@]}" OTEL_TRACES_SAMPLER=parentbased_always_on
