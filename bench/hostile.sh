#!/usr/bin/env bash
# An ordinary actor's latency while hostile guests run on the same node
# (issue 52, ADR 0063). Starts `wasmkeep dev` (folder bucket, lease TTL 2 s
# renewed every 250 ms, events and statements capped at 3 s) with the
# counter and the test guests, then for each hostile kind: four threads send
# it back to back to four actors for SECONDS while one client increments a
# counter of another actor, one request at a time. Prints the counter's
# p50/p99/max latency, its errors, and the lease renewals and failures in
# the window; the first row runs no hostile guest.
#
# Usage: bench/hostile.sh [SECONDS]   (default 10; BIN=path/to/wasmkeep to
# measure another build, e.g. one from before ADR 0063)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SECONDS_PER_KIND="${1:-10}"
BIN="${BIN:-$ROOT/target/release/wasmkeep}"
WASM="$ROOT/target/wasm"
for g in counter kitchen-sink spin hog; do
  [ -f "$WASM/$g.wasm" ] || { echo "missing $WASM/$g.wasm: run scripts/build-guests" >&2; exit 1; }
done
[ -x "$BIN" ] || { echo "missing $BIN: cargo build --release" >&2; exit 1; }

DIR="$(mktemp -d)"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
"$BIN" dev --bucket "file://$DIR/bucket" --listen "127.0.0.1:$PORT" \
  counter="$WASM/counter.wasm" ks="$WASM/kitchen-sink.wasm" \
  spin="$WASM/spin.wasm" hog="$WASM/hog.wasm" \
  --event-time-max 3s --heartbeat 250ms --lease-ttl 2s >"$DIR/node.log" 2>&1 &
NODE=$!
trap 'kill "$NODE" 2>/dev/null; wait "$NODE" 2>/dev/null; rm -rf "$DIR"' EXIT

echo "# $BIN, $SECONDS_PER_KIND s per kind, $(nproc) CPUs"
python3 - "$PORT" "$SECONDS_PER_KIND" <<'PY'
import http.client, sys, threading, time

port, seconds = int(sys.argv[1]), float(sys.argv[2])

def request(method, path, body=b""):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(method, path, body=body)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()

def metric(name):
    _, body = request("GET", "/_wasmkeep/metrics")
    for line in body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0

deadline = time.time() + 30
while True:
    try:
        if request("GET", "/_wasmkeep/health")[0] == 200:
            break
    except OSError:
        pass
    if time.time() > deadline:
        sys.exit("the node did not start")
    time.sleep(0.05)

CTE = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c)"
kinds = [
    ("none", None, None, b"", None),
    ("recursive query", "ks", "/sql/run?rows=1", f"{CTE} SELECT count(*) FROM c".encode(), None),
    ("cross join", "ks", "/sql/run?rows=1",
     b"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 1000000) SELECT count(*) FROM c AS a, c AS b", None),
    ("write that loops", "ks", "/sql/run", f"INSERT INTO w (x) {CTE} SELECT count(*) FROM c".encode(),
     b"CREATE TABLE IF NOT EXISTS w (x)"),
    ("value that grows", "ks", "/sql/run?rows=1",
     f"{CTE} SELECT length(group_concat(zeroblob(1000000))) FROM c".encode(), None),
    ("200 MB table", "ks", "/sql/run",
     b"CREATE TABLE big AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 200000) SELECT x, zeroblob(1000) AS pad FROM c", None),
    ("wasm loop", "spin", "/spin", b"", None),
    ("wasm memory", "hog", "/hog", b"", None),
]

print(f"{'hostile guest':<18} {'requests':>8} {'errors':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'renewals':>8} {'lease failures':>14} {'hostile answers':>15}")
increments = 0
for k, (name, cls, path, body, setup) in enumerate(kinds):
    stop = threading.Event()
    hostile_answers = []
    def hostile(i):
        actor = f"/demo/{cls}/k{k}-{i}"
        if setup:
            request("POST", actor + "/sql/run", setup)
        while not stop.is_set():
            try:
                status, _ = request("POST", actor + path, body)
                hostile_answers.append(status)
            except OSError:
                hostile_answers.append(0)
    threads = [threading.Thread(target=hostile, args=(i,)) for i in range(4)] if cls else []
    for t in threads:
        t.start()
    time.sleep(0.5 if cls else 0)  # let the hostile guests start
    renewals, failures = metric("wasmkeep_lease_renewals_total"), metric("wasmkeep_lease_renewal_failures_total")
    latencies, errors = [], 0
    end = time.time() + seconds
    while time.time() < end:
        t0 = time.perf_counter()
        try:
            status, _ = request("POST", "/demo/counter/bystander/increment")
        except OSError:
            status = 0
        latencies.append((time.perf_counter() - t0) * 1000)
        if status != 200:
            errors += 1
    renewed = metric("wasmkeep_lease_renewals_total") - renewals
    failed = metric("wasmkeep_lease_renewal_failures_total") - failures
    stop.set()
    for t in threads:
        t.join()
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]
    statuses = ",".join(f"{s}x{hostile_answers.count(s)}" for s in sorted(set(hostile_answers)))
    print(f"{name:<18} {len(latencies):>8} {errors:>6} {pick(0.5):>8.2f} {pick(0.99):>8.2f} {latencies[-1]:>8.1f} {renewed:>8.0f} {failed:>14.0f} {statuses or '-':>15}")
PY
