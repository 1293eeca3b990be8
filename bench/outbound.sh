#!/usr/bin/env bash
# Outbound HTTP from an actor (issue 54, ADR 0066), on loopback. Starts a
# small upstream (Python asyncio: one fixed 200 answer per connection, then
# close) and `wasmkeep dev` with the proxy example allowed to reach it, then:
#
#  1. direct:   the upstream called by this script, one new connection per
#               call (as the node makes them), sequentially;
#  2. no-call:  GET /demo/proxy/b/last through the node (an event that makes
#               no outbound call), sequentially on one kept-alive connection;
#  3. proxied:  GET /demo/proxy/b/fetch?url=<upstream> through the node (the
#               event makes the call and stores its status), likewise;
#  4. rate:     CLIENTS threads, each on its own actor, calling /fetch back
#               to back for SECONDS: outbound calls per second of the node.
#
# The added latency of an outbound call is (proxied - no-call) against
# direct, at p50 and p99. Everything shares the machine's CPUs: the client,
# the upstream and the node.
#
# Usage: bench/outbound.sh [CALLS] [SECONDS] [CLIENTS]   (default 2000 10 8;
# BIN=path/to/wasmkeep to measure another build)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CALLS="${1:-2000}"
SECONDS_RATE="${2:-10}"
CLIENTS="${3:-8}"
BIN="${BIN:-$ROOT/target/release/wasmkeep}"
WASM="$ROOT/target/wasm"
[ -f "$WASM/proxy.wasm" ] || { echo "missing $WASM/proxy.wasm: run scripts/build-guests" >&2; exit 1; }
[ -x "$BIN" ] || { echo "missing $BIN: cargo build --release" >&2; exit 1; }

DIR="$(mktemp -d)"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PORT="$(free_port)"
UP_PORT="$(free_port)"

python3 - "$UP_PORT" >"$DIR/upstream.log" 2>&1 <<'PY' &
import asyncio, sys
ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
async def serve(reader, writer):
    try:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(ANSWER)
        await writer.drain()
    except Exception:
        pass
    finally:
        writer.close()
async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", int(sys.argv[1]), backlog=1024)
    async with server:
        await server.serve_forever()
asyncio.run(main())
PY
UPSTREAM=$!
"$BIN" deploy proxy "$WASM/proxy.wasm" --bucket "file://$DIR/bucket" \
  --allow-outbound "127.0.0.1:$UP_PORT" >/dev/null
"$BIN" dev --bucket "file://$DIR/bucket" --listen "127.0.0.1:$PORT" \
  proxy="$WASM/proxy.wasm" >"$DIR/node.log" 2>&1 &
NODE=$!
trap 'kill "$NODE" "$UPSTREAM" 2>/dev/null; wait "$NODE" "$UPSTREAM" 2>/dev/null; rm -rf "$DIR"' EXIT

echo "# $BIN, $CALLS sequential calls, rate: $CLIENTS clients for $SECONDS_RATE s, $(nproc) CPUs"
python3 - "$PORT" "$UP_PORT" "$CALLS" "$SECONDS_RATE" "$CLIENTS" <<'PY'
import http.client, sys, threading, time, urllib.parse

port, up_port, calls, seconds, clients = (int(a) for a in sys.argv[1:6])
target = f"http://127.0.0.1:{up_port}/hello"
fetch_path = "/fetch?url=" + urllib.parse.quote(target, safe="")

deadline = time.time() + 60
while True:
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/_wasmkeep/health")
        if c.getresponse().status == 200:
            break
    except OSError:
        pass
    if time.time() > deadline:
        sys.exit("the node did not start")
    time.sleep(0.1)

def pct(samples, p):
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * p / 100))]

def direct():
    t = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", up_port, timeout=30)
    c.request("GET", "/hello")
    r = c.getresponse()
    body = r.read()
    c.close()
    assert r.status == 200 and body == b"ok", (r.status, body)
    return time.perf_counter() - t

def through(conn, path, expect):
    t = time.perf_counter()
    conn.request("GET", path)
    r = conn.getresponse()
    body = r.read()
    assert r.status == 200 and body.startswith(expect), (r.status, body)
    return time.perf_counter() - t

node = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
through(node, "/demo/proxy/b" + fetch_path, b"ok")  # activates, first compile
rows = {}
for _ in range(200):  # warm-up
    direct(); through(node, "/demo/proxy/b" + fetch_path, b"ok"); through(node, "/demo/proxy/b/last", b"200")
rows["direct"] = [direct() for _ in range(calls)]
rows["no-call"] = [through(node, "/demo/proxy/b/last", b"200") for _ in range(calls)]
rows["proxied"] = [through(node, "/demo/proxy/b" + fetch_path, b"ok") for _ in range(calls)]
print(f"{'path':<10} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
for name, s in rows.items():
    print(f"{name:<10} {pct(s, 50)*1e3:8.3f} {pct(s, 99)*1e3:8.3f} {sum(s)/len(s)*1e3:8.3f}")
for p in (50, 99):
    added = pct(rows["proxied"], p) - pct(rows["no-call"], p)
    print(f"added by the outbound call at p{p}: {added*1e3:.3f} ms "
          f"(proxied - no-call) against {pct(rows['direct'], p)*1e3:.3f} ms direct")

done = [0] * clients
errors = [0] * clients
stop = time.time() + seconds
def loop(i):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    path = f"/demo/proxy/r{i}" + fetch_path
    while time.time() < stop:
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        if r.status == 200:
            done[i] += 1
        else:
            errors[i] += 1
threads = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
t = time.perf_counter()
for th in threads: th.start()
for th in threads: th.join()
elapsed = time.perf_counter() - t
print(f"rate: {sum(done)} outbound calls in {elapsed:.1f} s = {sum(done)/elapsed:.0f}/s "
      f"({clients} clients, {sum(errors)} errors)")
PY
