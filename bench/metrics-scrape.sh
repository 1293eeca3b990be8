#!/usr/bin/env bash
# The metrics page (ADR 0071), on loopback with a folder bucket. Starts
# `wasmkeep dev` (counter class, actors kept resident), then measures:
#
#  1. per request, on the fresh node: CLIENTS connections POST
#     /demo/counter/hot/increment for SECS seconds (the peer benchmark's S1
#     shape: one hot actor), ROUNDS times: requests per second and the
#     server's CPU time per request (from /proc/PID/stat). The load comes
#     from wrk when it is installed (Debian's `wrk`), else from Python
#     threads (then the rate is the client's; the CPU per request is the
#     server's own either way);
#  2. scrape: touches ACTORS counter actors (one increment each) spread
#     over TENANTS tenants, then RUNS GETs of /_wasmkeep/metrics on one
#     connection, p50 and p99 in ms (client time included: Python's
#     http.client), the body's bytes and lines, and the (tenant, class)
#     pairs it names.
#
# Usage: bench/metrics-scrape.sh [ACTORS] [RUNS]   (default 10000 200)
#   TENANTS=1000 spreads the actors over 1,000 tenants (the label bound);
#   CLIENTS (16), SECS (10), ROUNDS (3); BIN=path/to/wasmkeep measures
#   another build (one before ADR 0071 too).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
ACTORS="${1:-10000}"
RUNS="${2:-200}"
TENANTS="${TENANTS:-1}"
CLIENTS="${CLIENTS:-16}"
SECS="${SECS:-10}"
ROUNDS="${ROUNDS:-3}"
WRK="$(command -v wrk || true)"
BIN="${BIN:-$ROOT/target/release/wasmkeep}"
WASM="${WASMKEEP_GUESTS_DIR:-$ROOT/target/wasm}"
[ -f "$WASM/counter.wasm" ] || { echo "missing $WASM/counter.wasm: run scripts/build-guests" >&2; exit 1; }
[ -x "$BIN" ] || { echo "missing $BIN: cargo build --release" >&2; exit 1; }

DIR="$(mktemp -d)"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
# Long idle timeouts: every touched actor stays resident while measured.
"$BIN" dev --bucket "file://$DIR/bucket" --listen "127.0.0.1:$PORT" --data-dir "$DIR/data" \
  --max-actors $((ACTORS + 100)) --idle-timeout 1h --instance-idle-timeout 30m \
  counter="$WASM/counter.wasm" >"$DIR/node.log" 2>&1 &
NODE=$!
trap 'kill "$NODE" 2>/dev/null; wait "$NODE" 2>/dev/null; rm -rf "$DIR"' EXIT

echo "# $BIN, $ACTORS actors over $TENANTS tenants, $RUNS scrapes, $(nproc) CPUs"
python3 - "$PORT" "$ACTORS" "$RUNS" "$TENANTS" "$CLIENTS" "$SECS" "$NODE" "$ROUNDS" "$WRK" "$DIR" <<'PY'
import http.client, os, re, subprocess, sys, threading, time
from concurrent.futures import ThreadPoolExecutor

port, actors, runs, tenants, clients, secs, pid, rounds = map(int, sys.argv[1:9])
wrk, tmp = sys.argv[9], sys.argv[10]

def conn():
    return http.client.HTTPConnection("127.0.0.1", port, timeout=120)

deadline = time.time() + 60
while True:
    try:
        c = conn(); c.request("GET", "/_wasmkeep/health")
        if c.getresponse().status == 200:
            break
    except OSError:
        pass
    if time.time() > deadline:
        sys.exit("the node did not start")
    time.sleep(0.1)

# Per request: one hot actor, CLIENTS connections.
tick = os.sysconf("SC_CLK_TCK")
def cpu_s():
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / tick
url = f"http://127.0.0.1:{port}/demo/counter/hot/increment"
def python_load():
    def hammer(stop, counts, k):
        c = conn()
        n = 0
        while not stop.is_set():
            c.request("POST", "/demo/counter/hot/increment")
            r = c.getresponse(); r.read()
            assert r.status == 200, r.status
            n += 1
        counts[k] = n
    stop, counts = threading.Event(), [0] * clients
    threads = [threading.Thread(target=hammer, args=(stop, counts, k)) for k in range(clients)]
    for th in threads: th.start()
    time.sleep(secs)
    stop.set()
    for th in threads: th.join()
    return sum(counts)
def wrk_load():
    script = os.path.join(tmp, "post.lua")
    with open(script, "w") as f:
        f.write('wrk.method = "POST"\n')
    out = subprocess.run([wrk, "-t1", f"-c{clients}", f"-d{secs}s", "-s", script, url],
                         capture_output=True, text=True, check=True).stdout
    assert "Non-2xx" not in out, out
    return int(re.search(r"(\d+) requests in", out).group(1))
warm = conn()
for _ in range(200):
    warm.request("POST", "/demo/counter/hot/increment"); warm.getresponse().read()
load = wrk_load if wrk else python_load
for _ in range(rounds):
    cpu0, t0 = cpu_s(), time.perf_counter()
    n = load()
    cpu1, t1 = cpu_s(), time.perf_counter()
    print(f"S1-shaped ({'wrk' if wrk else 'python'}), {clients} clients, {secs} s: "
          f"{n / (t1 - t0):.0f} requests/s, server CPU {(cpu1 - cpu0) / n * 1e6:.1f} us/request")

def touch(chunk):
    c = conn()
    for i in chunk:
        c.request("POST", f"/t{i % tenants}/counter/a{i:05d}/increment")
        r = c.getresponse(); r.read()
        assert r.status == 200, r.status
t = time.perf_counter()
with ThreadPoolExecutor(16) as pool:
    list(pool.map(touch, [range(k, actors, 16) for k in range(16)]))
print(f"touched {actors} actors in {time.perf_counter() - t:.1f} s")

def pct(samples, p):
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * p / 100))]

def scrape(c):
    c.request("GET", "/_wasmkeep/metrics")
    r = c.getresponse()
    body = r.read()
    assert r.status == 200, r.status
    return body

c = conn()
body = scrape(c)
# Summed over its label sets (a build before ADR 0071 has one, unlabelled).
resident = sum(float(l.rsplit(b" ", 1)[1]) for l in body.splitlines()
               if l.startswith((b"wasmkeep_resident_actors{", b"wasmkeep_resident_actors ")))
assert resident >= actors, f"only {resident} actors resident"
pairs = sum(1 for l in body.splitlines() if l.startswith(b"wasmkeep_events_total{"))
lines = body.count(b"\n")
samples = []
for _ in range(runs):
    t = time.perf_counter(); scrape(c); samples.append(time.perf_counter() - t)
print(f"scrape: p50 {pct(samples, 50)*1e3:.2f} ms  p99 {pct(samples, 99)*1e3:.2f} ms  "
      f"body {len(body)} bytes, {lines} lines, {pairs} (tenant, class) pairs, "
      f"{int(resident)} resident actors")

PY
