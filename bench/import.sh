#!/usr/bin/env bash
# `wasmkeep actor export` and `actor import` (issue 56, ADR 0065, 0069), on
# loopback with a folder bucket. Starts `wasmkeep dev` (heartbeat HEARTBEAT),
# makes a SQLite file of about MB megabytes (one table of 1 KiB rows,
# 4096-byte pages, made by Python's sqlite3), then measures, RUNS times
# each (p50 and p90, a process start included):
#
#  1. `actor import` of the file into a new actor (no data), and with
#     --replace into that same actor while it is resident; the node
#     carries a request out at its next heartbeat, so half a heartbeat
#     period is spent waiting on average;
#  2. the file checks alone: `actor import` of a file that is refused at
#     its last check (a b-tree page overwritten), which reads and checks
#     every page and writes nothing;
#  3. `actor export` of the imported actor to a new file;
#  4. the first request answered by the imported actor after an import
#     into a new actor (it restores from the fence's snapshot).
#
# Usage: bench/import.sh [MB] [RUNS]   (default 16 5; HEARTBEAT=300ms;
# BIN=path/to/wasmkeep to measure another build)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
MB="${1:-16}"
RUNS="${2:-5}"
HEARTBEAT="${HEARTBEAT:-300ms}"
BIN="${BIN:-$ROOT/target/release/wasmkeep}"
WASM="${WASMKEEP_GUESTS_DIR:-$ROOT/target/wasm}"
[ -f "$WASM/kitchen-sink.wasm" ] || { echo "missing $WASM/kitchen-sink.wasm: run scripts/build-guests" >&2; exit 1; }
[ -x "$BIN" ] || { echo "missing $BIN: cargo build --release" >&2; exit 1; }

DIR="$(mktemp -d)"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
"$BIN" dev --bucket "file://$DIR/bucket" --listen "127.0.0.1:$PORT" --data-dir "$DIR/data" \
  --heartbeat "$HEARTBEAT" --console off ks="$WASM/kitchen-sink.wasm" >"$DIR/node.log" 2>&1 &
NODE=$!
trap 'kill "$NODE" 2>/dev/null; wait "$NODE" 2>/dev/null; rm -rf "$DIR"' EXIT

echo "# $BIN, about $MB MB, $RUNS runs each, heartbeat $HEARTBEAT, $(nproc) CPUs"
python3 - "$PORT" "$MB" "$RUNS" "$BIN" "file://$DIR/bucket" "$DIR" <<'PY'
import http.client, os, sqlite3, subprocess, sys, time

port, mb, runs = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
binary, bucket, work = sys.argv[4], sys.argv[5], sys.argv[6]

def send(method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request(method, path, body=body)
    r = c.getresponse()
    return r.status, r.read()

def get(path):
    return send("GET", path)

deadline = time.time() + 60
while True:
    try:
        if get("/_wasmkeep/health")[0] == 200:
            break
    except OSError:
        pass
    if time.time() > deadline:
        sys.exit("the node did not start")
    time.sleep(0.1)

source = os.path.join(work, "source.sqlite")
db = sqlite3.connect(source)
db.execute("PRAGMA page_size = 4096")
db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB)")
db.executemany("INSERT INTO t (body) VALUES (randomblob(1024))", [()] * (mb * 1000))
db.commit()
db.close()
size = os.path.getsize(source)
corrupt = os.path.join(work, "corrupt.sqlite")
with open(source, "rb") as f:
    data = bytearray(f.read())
data[-4096:-4096 + 64] = b"\x5a" * 64
with open(corrupt, "wb") as f:
    f.write(data)
print(f"file: {size} bytes ({size // 4096} pages)")

def cli(*args, ok=True):
    t = time.perf_counter()
    out = subprocess.run([binary, "actor", *args, "--bucket", bucket], capture_output=True)
    ms = (time.perf_counter() - t) * 1000
    if out.returncode != 0 and ok:
        sys.exit(f"{args}: {out.stderr.decode()}")
    if out.returncode == 0 and not ok:
        sys.exit(f"{args}: accepted")
    return ms

def report(name, ms):
    ms = sorted(ms)
    p = lambda q: ms[min(len(ms) - 1, int(q * len(ms)))]
    print(f"{name:<44} p50 {p(0.5):8.1f} ms  p90 {p(0.9):8.1f} ms")

fresh, replace, checks, export, first = [], [], [], [], []
for i in range(runs):
    actor = f"t/ks/imported-{i}"
    fresh.append(cli("import", actor, source))
    t = time.perf_counter()
    status, body = send("POST", f"/{actor}/sql/run?rows=1", b"SELECT count(*) FROM t")
    first.append((time.perf_counter() - t) * 1000)
    if status != 200:
        sys.exit(f"the imported actor answered {status}: {body[:200]!r}")
    replace.append(cli("import", actor, source, "--replace"))
    checks.append(cli("import", actor, corrupt, "--replace", ok=False))
    export.append(cli("export", actor, os.path.join(work, f"export-{i}.sqlite")))
report("import into a new actor", fresh)
report("first request to it (restore)", first)
report("import --replace into it, resident", replace)
report("a refused file (checks only)", checks)
report("export", export)
PY
