#!/usr/bin/env bash
# Runs the peer benchmark (the team's workerd harness, shared/bench/workerd)
# against workerd and against `wasmkeep dev` in one run on this machine, both
# durable, and prints both tables. Only ratios from one run count: the disk's
# flush latency here varies 20x over an hour.
#
# Usage: bench/vs-workerd.sh [HARNESS_DIR]      (default: ../shared/bench/workerd)
#   Knobs of the harness pass through (DUR, REPS, CONCS, S2_ACTORS, ...), e.g.
#   DUR=3 REPS=1 S1_WARMUP=200 S2_ACTORS=300 S3_ACTORS=50 bench/vs-workerd.sh
#   ONLY=wasmkeep or ONLY=workerd runs one side; WASMKEEP_BIN=path uses a built binary.
#   SETTLE=0 skips the settling of the file system before each server (below).
#
# The harness is copied to a writable folder (bench-results/harness) and set up
# there once (./setup.sh: apt, npm, oha). For wasmkeep, the copy's server
# start is replaced by `wasmkeep dev` on a folder bucket (its compiled-component
# cache is the default one, so only the first start ever compiles), its base and
# WebSocket URLs get the tenant and class (/bench/counter), and "actor databases on disk" counts
# actor folders in the bucket instead of *.sqlite files (waiting up to 10 s
# for the node's next checkpoint to write its young objects, ADR 0034).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SRC="${1:-$ROOT/../shared/bench/workerd}"
WORK="$ROOT/bench-results"
HARNESS="$WORK/harness"
mkdir -p "$WORK"
[ -d "$SRC" ] || { echo "no harness at $SRC" >&2; exit 1; }

if [ ! -x "$HARNESS/tools/oha/bin/oha" ] || [ ! -d "$HARNESS/node_modules" ]; then
  rm -rf "$HARNESS"
  cp -r "$SRC" "$HARNESS"
  chmod -R u+w "$HARNESS"
  (cd "$HARNESS" && ./setup.sh)
fi

# WASMKEEP_BIN runs an already built binary (its guests are found in the
# target/wasm folder next to it); otherwise this checkout's production
# binary is built (the dist profile, ADR 0056).
if [ -n "${WASMKEEP_BIN:-}" ]; then
  # Absolute: the harness runs it from its own folder.
  WASMKEEP="$(readlink -f "$WASMKEEP_BIN")"
  [ -x "$WASMKEEP" ] || { echo "vs-workerd: no executable at WASMKEEP_BIN=$WASMKEEP_BIN" >&2; exit 1; }
else
  "$ROOT/scripts/build-guests" >/dev/null
  (cd "$ROOT" && cargo build --profile dist -j2 -p wasmkeep-server --bin wasmkeep)
  WASMKEEP="$ROOT/target/dist/wasmkeep"
fi

# The wasmkeep variant of run.sh.
python3 - "$HARNESS/run.sh" "$HARNESS/run-wasmkeep.sh" "$WASMKEEP" <<'PY'
import sys
src, dst, exe = sys.argv[1:4]
s = open(src).read()
def sub(old, new):
    global s
    if old not in s:
        sys.exit(f"vs-workerd: the harness changed, cannot patch: {old!r}")
    s = s.replace(old, new)
sub('BASE="http://127.0.0.1:$PORT"', 'BASE="http://127.0.0.1:$PORT/bench/counter"')
sub('''  local cmd=("$WORKERD" serve "$HERE/workerd/config.capnp"
             --socket-addr "http=127.0.0.1:$PORT" --directory-path "do-storage=$DATA")''',
    f'''  local cmd=("{exe}" dev --bucket "file://$DATA" --listen "127.0.0.1:$PORT")''')
sub('''actor_dbs() { find "$DATA" -name '*.sqlite' ! -name 'metadata.sqlite' | wc -l; }''',
    '''actor_dbs() { find "$DATA/apps" -mindepth 5 -maxdepth 5 -type d -path '*/actors/*/*/*' 2>/dev/null | wc -l; }''')
# A node alone on its folder keeps young objects in its journal until its
# next checkpoint (ADR 0034; every 4 s when idle): the new actors' folders
# appear by then. Wait for them, at most 10 s.
sub('''  created=$(( $(actor_dbs) - before ))''',
    '''  for _ in $(seq 100); do
    created=$(( $(actor_dbs) - before )); [ "$created" -ge "$ok" ] && break; sleep 0.1
  done''')
sub('--url "ws://127.0.0.1:$PORT/wsroom/ws"', '--url "ws://127.0.0.1:$PORT/bench/counter/wsroom/ws"')
sub('if curl -s -o /dev/null --max-time 1 "$BASE/"', 'if curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$PORT/"')
open(dst, "w").write(s)
PY
chmod +x "$HARNESS/run-wasmkeep.sh"

# Each server starts on a settled file system. The harness deletes a run's
# storage when it ends (workerd's: ~100,000 files), and on ext4 without a
# journal (these VMs) every file created in the next minute scans past the
# freed inodes whose inode-table blocks are still cached (`recently_deleted`,
# ADR 0027): measured, the following server's S2 ran at half speed and its S3
# at a third. So the run is not charged for its predecessor's cleanup: write
# everything back, then drop the clean caches (as root) or wait out ext4's
# 60 s window for clean blocks.
settle() {
  [ "${SETTLE:-1}" = 0 ] && return 0
  sync
  if [ -w /proc/sys/vm/drop_caches ] && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then
    echo "vs-workerd: file system settled (synced, caches dropped)" >&2
  else
    echo "vs-workerd: settling the file system: synced, waiting 61 s" >&2
    sleep 61
  fi
}

# The machine's CPU speed around each server's run, next to the disk's
# flush latency the harness prints: wasmkeep is CPU-bound in the rate
# scenarios and workerd flush-bound, and both move within an hour here
# (ADR 0047), so a ratio is read with both.
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
MACHINE="$WORK/machine.txt"
: > "$MACHINE"
timed() {   # timed NAME COMMAND...: runs the server's harness, notes the machine's speed around it
  local name=$1 p0 p1 s0 s1 t0 t1; shift
  p0=$(cpu_probe); s0=$(steal_ticks); t0=$(date +%s)
  "$@" 2>&1 | tee "$WORK/$name.out" | grep -v '^\[' || true
  p1=$(cpu_probe); s1=$(steal_ticks); t1=$(date +%s)
  python3 - "$name" "$p0" "$p1" "$s0" "$s1" "$t0" "$t1" "$(getconf CLK_TCK)" <<'PY' | tee -a "$MACHINE" >&2
import sys
name, p0, p1, s0, s1, t0, t1, hz = sys.argv[1:9]
secs = max(int(t1) - int(t0), 1)
steal = (int(s1) - int(s0)) / int(hz) / secs
print(f"machine during {name}'s run: cpu probe {p0} ms before, {p1} ms after "
      f"(lower is faster); steal {steal:.2f} cores on average over {secs} s")
PY
}

cd "$HARNESS"
if [ "${ONLY:-}" != wasmkeep ]; then
  settle
  echo "== workerd" >&2
  timed workerd ./run.sh
fi
if [ "${ONLY:-}" != workerd ]; then
  settle
  echo "== wasmkeep" >&2
  timed wasmkeep ./run-wasmkeep.sh
fi
cat "$MACHINE" >&2
echo "results: $HARNESS/results/ (newest two runs); raw output in $WORK/*.out; machine speed in $MACHINE" >&2
