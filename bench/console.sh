#!/usr/bin/env bash
# The web console (issue 56, ADR 0067), on loopback with a folder bucket.
# Starts `wasmkeep dev` (console on, no token), touches ACTORS counter
# actors (one increment each), then measures:
#
#  1. page weight: the page, script and stylesheet as served (bytes);
#  2. listing: the console's first page of actors (50), a page of 1,000,
#     and every page of 1,000 until the end (all ACTORS actors), and the
#     command line's `actor list` of all of them (a process each);
#  3. SQL: the console's read-only statement on one actor (it restores
#     the actor from the bucket each time) while the actor is resident
#     and after it hibernated, and `actor sql` (a process each) the same;
#     `actor sql --write` (the holder runs it at its next heartbeat).
#
# Each figure: RUNS runs, p50 and p90 in ms, client time included (Python's
# http.client on one connection; a process start for the command line).
#
# Usage: bench/console.sh [ACTORS] [RUNS]   (default 10000 20;
# BIN=path/to/wasmkeep to measure another build)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
ACTORS="${1:-10000}"
RUNS="${2:-20}"
BIN="${BIN:-$ROOT/target/release/wasmkeep}"
WASM="${WASMKEEP_GUESTS_DIR:-$ROOT/target/wasm}"
[ -f "$WASM/counter.wasm" ] || { echo "missing $WASM/counter.wasm: run scripts/build-guests" >&2; exit 1; }
[ -x "$BIN" ] || { echo "missing $BIN: cargo build --release" >&2; exit 1; }

DIR="$(mktemp -d)"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
# Idle actors hibernate after 2 s, so the hibernated case is reached by waiting.
"$BIN" dev --bucket "file://$DIR/bucket" --listen "127.0.0.1:$PORT" --data-dir "$DIR/data" \
  --idle-timeout 2s counter="$WASM/counter.wasm" >"$DIR/node.log" 2>&1 &
NODE=$!
trap 'kill "$NODE" 2>/dev/null; wait "$NODE" 2>/dev/null; rm -rf "$DIR"' EXIT

echo "# $BIN, $ACTORS actors, $RUNS runs each, $(nproc) CPUs"
python3 - "$PORT" "$ACTORS" "$RUNS" "$BIN" "file://$DIR/bucket" <<'PY'
import http.client, json, subprocess, sys, time, urllib.parse
from concurrent.futures import ThreadPoolExecutor

port, actors, runs = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
binary, bucket = sys.argv[4], sys.argv[5]

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

def get(c, path):
    c.request("GET", path)
    r = c.getresponse()
    body = r.read()
    assert r.status == 200, (path, r.status, body[:200])
    return body

def touch(chunk):
    c = conn()
    for i in chunk:
        c.request("POST", f"/demo/counter/a{i:05d}/increment")
        r = c.getresponse(); r.read()
        assert r.status == 200, r.status
t = time.perf_counter()
with ThreadPoolExecutor(16) as pool:
    list(pool.map(touch, [range(k, actors, 16) for k in range(16)]))
print(f"touched {actors} actors in {time.perf_counter() - t:.1f} s")

def pct(samples, p):
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * p / 100))]

def timed(label, fn, n=runs):
    fn()  # warm-up
    samples = []
    for _ in range(n):
        t = time.perf_counter(); fn(); samples.append(time.perf_counter() - t)
    print(f"{label:<58} p50 {pct(samples, 50)*1e3:8.1f} ms  p90 {pct(samples, 90)*1e3:8.1f} ms")

c = conn()
weight = {name: len(get(c, f"/_wasmkeep/console{name}")) for name in ("/", "/console.js", "/console.css")}
print(f"page weight: {sum(weight.values())} bytes in 3 requests {weight}")

def first_page(limit):
    body = json.loads(get(c, f"/_wasmkeep/console/api/actors?prefix=demo%2Fcounter%2F&limit={limit}"))
    assert len(body["actors"]) == min(limit, actors), len(body["actors"])
def all_pages():
    after, seen = "", 0
    while True:
        body = json.loads(get(c, "/_wasmkeep/console/api/actors?limit=1000&after=" + urllib.parse.quote(after, safe="")))
        seen += len(body["actors"])
        if not body["next"]:
            break
        after = body["next"]
    assert seen == actors, seen
def cli(*args):
    out = subprocess.run([binary, *args, "--bucket", bucket], capture_output=True, check=True)
    return out.stdout
def cli_list():
    lines = cli("actor", "list").count(b"\n")
    assert lines == actors + 1, lines

timed("console: first page of 50 actors", lambda: first_page(50))
timed("console: a page of 1,000 actors", lambda: first_page(1000))
timed(f"console: all {actors} actors, pages of 1,000", all_pages, max(3, runs // 4))
timed(f"actor list (CLI process): all {actors} actors", cli_list, max(3, runs // 4))

actor = "demo/counter/hot"
q = "/_wasmkeep/console/api/sql?id=" + actor + "&q=" + urllib.parse.quote("SELECT n FROM counter")
def resident():
    # An event keeps the actor resident (idle timeout 2 s).
    get(c, f"/demo/counter/hot/value")
def console_sql():
    assert json.loads(get(c, q))["rows"] == [[1]]
def cli_sql():
    assert cli("actor", "sql", actor, "SELECT n FROM counter").endswith(b"1\n")
cw = conn(); cw.request("POST", "/demo/counter/hot/increment"); cw.getresponse().read()
timed("console SQL, actor resident", lambda: (resident(), console_sql()) and None)
timed("actor sql (CLI process), actor resident", lambda: (resident(), cli_sql()) and None)
timed("event only (GET value), for the two lines above", resident)
def hibernated():
    deadline = time.time() + 60
    while True:
        body = json.loads(get(c, "/_wasmkeep/console/api/actor?id=" + actor))
        if not body["resident_here"]:
            return
        assert time.time() < deadline, "the actor never hibernated"
        time.sleep(0.2)
hibernated()
timed("console SQL, actor hibernated", console_sql)
timed("actor sql (CLI process), actor hibernated", cli_sql)
body = json.loads(get(c, "/_wasmkeep/console/api/actor?id=" + actor))
assert not body["resident_here"], "reading woke the actor"
print("the reads did not wake the hibernated actor")
# A write runs on the holder, which sees the request at its next
# heartbeat (3 s by default): the wait for it dominates.
def cli_write():
    cli("actor", "sql", actor, "UPDATE counter SET n = n + 1", "--write")
timed("actor sql --write (CLI process), heartbeat 3 s", cli_write, max(3, runs // 2))
PY
