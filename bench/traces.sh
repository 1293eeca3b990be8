#!/usr/bin/env bash
# The cost of traces (issue 57, ADR 0072) on the S1 workload (POST
# /increment to one hot counter actor), for three runs of one `wasmkeep
# dev` binary on a folder bucket: traces off, on at 1 % sampling
# (parentbased_traceidratio 0.01), and on at 100 %. The spans go to an
# OTLP/HTTP sink in this script (Python, answering 200 to every export).
#
# The figure to read is the node's CPU time per request (user + system
# from /proc, over the measured window): it does not depend on the speed
# of the client, which shares the 2 cores. Requests per second are
# printed too. The client is CONNS Python processes on keep-alive
# connections, each sending REQUESTS / CONNS requests.
#
# Usage: bench/traces.sh [REQUESTS] [CONNS]   (default 20000 4;
# BIN=path/to/wasmkeep to measure another build)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
REQUESTS="${1:-20000}"
CONNS="${2:-4}"
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

echo "# $BIN, S1 (one hot actor), $REQUESTS requests on $CONNS connections, $(nproc) CPUs"
printf '%-10s %10s %16s %14s\n' traces "req/s" "node CPU us/req" "OTLP exports"
run() {
  local label="$1"; shift
  local port; port="$(free_port)"
  rm -rf "$DIR/bucket" "$DIR/data"
  : >"$DIR/sink.count"
  env "$@" "$BIN" dev --bucket "file://$DIR/bucket" --listen "127.0.0.1:$port" \
    --data-dir "$DIR/data" --console off counter="$WASM/counter.wasm" >"$DIR/node-$label.log" 2>&1 &
  NODE=$!
  python3 - "$port" "$REQUESTS" "$CONNS" "$NODE" "$label" <<'PY'
import http.client, multiprocessing, os, sys, time
port, requests, conns, pid, label = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
path = "/bench/counter/hot/increment"
deadline = time.time() + 120
while True:
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("POST", path, body=b""); r = c.getresponse(); r.read()
        if r.status == 200:
            break
    except (OSError, http.client.HTTPException):
        pass
    if time.time() > deadline:
        sys.exit("the node did not serve")
    time.sleep(0.2)
def cpu():
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
def client(n):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for _ in range(n):
        c.request("POST", path, body=b""); r = c.getresponse(); r.read()
        if r.status != 200:
            sys.exit(f"{r.status}")
# Warm-up: the instance, the allocator, the exporter's first batches.
with multiprocessing.Pool(conns) as p:
    p.map(client, [500] * conns)
cpu0, t0 = cpu(), time.perf_counter()
with multiprocessing.Pool(conns) as p:
    p.map(client, [requests // conns] * conns)
elapsed, used = time.perf_counter() - t0, cpu() - cpu0
n = (requests // conns) * conns
print(f"{label:<10} {n / elapsed:10.0f} {used / n * 1e6:16.1f}", end="")
PY
  kill -TERM "$NODE"; wait "$NODE" 2>/dev/null || true; NODE=""
  printf ' %14s\n' "$(grep -c . "$DIR/sink.count" || true)"
}
OTEL=(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$SINK_PORT")
run off
run "1%" "${OTEL[@]}" OTEL_TRACES_SAMPLER=parentbased_traceidratio OTEL_TRACES_SAMPLER_ARG=0.01
run "100%" "${OTEL[@]}" OTEL_TRACES_SAMPLER=parentbased_always_on
