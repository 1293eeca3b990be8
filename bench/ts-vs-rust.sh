#!/usr/bin/env bash
# The TypeScript counter (examples/counter-js, @wasmkeep/sdk) beside the Rust
# counter (examples/counter) on one `wasmkeep dev` node with a folder
# bucket (issue 55). For each: the first request to a new actor (cold: the
# component instantiated, the table created, one durable write), then
# POST /increment to one actor on one keep-alive connection (latency p50
# and p90, and requests per second at that one connection), and the same
# with THREADS connections to as many actors. The client is Python's
# http.client: its own cost is in every figure, the same for both, so the
# ratios are what to read.
#
# Usage: bench/ts-vs-rust.sh [REQUESTS] [THREADS]   (default 2000 8;
# BIN=path/to/wasmkeep to measure another build)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
REQUESTS="${1:-2000}"
THREADS="${2:-8}"
BIN="${BIN:-$ROOT/target/release/wasmkeep}"
WASM="${WASMKEEP_GUESTS_DIR:-$ROOT/target/wasm}"
for c in counter counter-js; do
  [ -f "$WASM/$c.wasm" ] || { echo "missing $WASM/$c.wasm: run scripts/build-guests --js" >&2; exit 1; }
done
DIR="$(mktemp -d)"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
"$BIN" dev --bucket "file://$DIR/bucket" --listen "127.0.0.1:$PORT" --data-dir "$DIR/data" \
  --console off rust="$WASM/counter.wasm" ts="$WASM/counter-js.wasm" >"$DIR/node.log" 2>&1 &
NODE=$!
trap 'kill "$NODE" 2>/dev/null; wait "$NODE" 2>/dev/null; rm -rf "$DIR"' EXIT

echo "# $BIN, $REQUESTS requests, $THREADS connections, $(nproc) CPUs"
python3 - "$PORT" "$REQUESTS" "$THREADS" <<'PY'
import http.client, sys, threading, time

port, requests, threads = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

def conn():
    return http.client.HTTPConnection("127.0.0.1", port, timeout=120)

def post(c, path):
    c.request("POST", path, body=b"")
    r = c.getresponse()
    body = r.read()
    if r.status != 200:
        sys.exit(f"{path}: {r.status} {body[:200]!r}")

deadline = time.time() + 120
while True:
    try:
        c = conn()
        for cls in ("rust", "ts"):
            # A class new to the node answers 503 while it compiles.
            c.request("GET", f"/bench/{cls}/warm/value")
            r = c.getresponse(); r.read()
            if r.status != 200:
                raise OSError(r.status)
        break
    except (OSError, http.client.HTTPException):
        if time.time() > deadline:
            sys.exit("the node did not serve both classes")
        time.sleep(0.2)

def pct(ms, q):
    ms = sorted(ms)
    return ms[min(len(ms) - 1, int(q * len(ms)))]

for cls in ("rust", "ts"):
    c = conn()
    cold = []
    for i in range(50):
        t = time.perf_counter(); post(c, f"/bench/{cls}/cold-{i}/increment")
        cold.append((time.perf_counter() - t) * 1000)
    lat = []
    t0 = time.perf_counter()
    for _ in range(requests):
        t = time.perf_counter(); post(c, f"/bench/{cls}/hot/increment")
        lat.append((time.perf_counter() - t) * 1000)
    one = requests / (time.perf_counter() - t0)
    def loop(n):
        c = conn()
        for _ in range(requests // threads):
            post(c, f"/bench/{cls}/hot-{n}/increment")
    workers = [threading.Thread(target=loop, args=(n,)) for n in range(threads)]
    t0 = time.perf_counter()
    for w in workers: w.start()
    for w in workers: w.join()
    many = (requests // threads * threads) / (time.perf_counter() - t0)
    print(f"{cls:>4}: first request to a new actor p50 {pct(cold, .5):6.2f} ms p90 {pct(cold, .9):6.2f} ms | "
          f"1 connection p50 {pct(lat, .5):5.2f} ms p90 {pct(lat, .9):5.2f} ms {one:7.0f} req/s | "
          f"{threads} connections {many:7.0f} req/s")
PY
