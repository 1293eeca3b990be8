#!/usr/bin/env bash
# Compares wasmkeep builds on the peer benchmark's shapes, alternating them
# run by run (this machine's speed drifts by a third over an hour, so only
# runs close in time compare). For each run: requests per second, the
# server's CPU time per request (from /proc/PID/stat) and the storage
# device's writes, KiB written and flushes per request (from
# /sys/block/DEV/stat; this VM's disk tops out near 120 MB/s, which bounds
# S2 and S3), and the hypervisor's steal time; each round starts with a
# CPU probe (bench/lib.sh: a fixed loop's milliseconds), since this VM's
# CPU speed moves by up to 2x within an hour (ADR 0047).
#
# Usage: bench/compare-builds.sh BIN [BIN ...]   (labelled by file name, or
#        by folder name when the builds share one: builds/a/wasmkeep ...)
#   The BIN `workerd` runs the peer instead (the harness's workerd and
#   config, durable, on the same folder): `bench/compare-builds.sh workerd
#   target/dist/wasmkeep` measures the ratio with the two servers
#   alternating scenario by scenario, so that a slow stretch of the VM
#   (here the same build's rate can move by a third between rounds) falls
#   on both. A summary of the ratios, round by round, ends the output.
#   SCENARIOS   "s3 s2 s1c16" (default), any of: s1c1 s1c16 s1c64 s2 s3 s3long
#               (s3long: S3 on one server for LONG_PARTS runs of SECS back to
#               back, default 7; with SECS=10 its actors reach their first
#               snapshot, 256 records, about half-way, and compaction starts)
#   ROUNDS      alternations (default 2)
#   SECS        seconds per run (default 8)
#   DATA        folder for the buckets (default: a temporary folder in
#               bench-results/; a tmpfs such as /dev/shm measures CPU alone)
#   DEV         block device for the I/O counters (default: the one under DATA)
#   BUCKET      memory:// runs the nodes on the in-process memory bucket (no
#               durability at all): the ceiling of the folder path (ADR 0034)
#
# Needs the harness tools that bench/vs-workerd.sh sets up once (oha and
# actors.mjs in bench-results/harness). Each binary finds the guests in the
# target/wasm folder next to it, or in GUESTS.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
[ $# -ge 1 ] || { echo "usage: $0 BIN [BIN ...]" >&2; exit 1; }
SCENARIOS="${SCENARIOS:-s3 s2 s1c16}"
ROUNDS="${ROUNDS:-2}"
SECS="${SECS:-8}"
mkdir -p "$ROOT/bench-results"
if [ -n "${DATA:-}" ]; then
  mkdir -p "$DATA"; OWN_DATA=""
else
  DATA="$(mktemp -d "$ROOT/bench-results/compare.XXXXXX")"; OWN_DATA="$DATA"
fi
SOURCE="$(findmnt -n -o SOURCE -T "$DATA" | head -n 1)"
DEV="${DEV:-$(lsblk -no PKNAME "$SOURCE" 2>/dev/null | head -n 1 || true)}"
DEV="${DEV:-$(basename "$SOURCE")}"
PORT=$((20000 + RANDOM % 20000))

PID=""
RUN=0
cleanup() {
  if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
  rm -rf "$DATA"/done-*
  if [ -n "$OWN_DATA" ]; then rm -rf "$OWN_DATA"; fi
}
trap cleanup EXIT
echo "data in $DATA (device ${DEV:-unknown}), ${SECS}s per run, $ROUNDS rounds" >&2

WORKERD="$HARNESS/node_modules/@cloudflare/workerd-linux-64/bin/workerd"
# base BIN: the counter class's base URL on a server of BIN.
base() {
  if [ "$1" = workerd ]; then echo "http://127.0.0.1:$PORT"; else echo "http://127.0.0.1:$PORT/bench/counter"; fi
}
start() {   # start BIN DIR
  local bin=$1 dir=$2 guests=${GUESTS:-$(dirname "$(dirname "$1")")/wasm} health
  rm -rf "$dir"; mkdir -p "$dir"
  if [ "$bin" = workerd ]; then
    "$WORKERD" serve "$HARNESS/workerd/config.capnp" --socket-addr "http=127.0.0.1:$PORT" \
      --directory-path "do-storage=$dir" > "$dir.log" 2>&1 &
    health="http://127.0.0.1:$PORT/health-check/value"
  else
    "$bin" dev --guests-dir "$guests" --bucket "${BUCKET:-file://$dir}" --listen "127.0.0.1:$PORT" > "$dir.log" 2>&1 &
    health="http://127.0.0.1:$PORT/_wasmkeep/health"
  fi
  PID=$!
  for _ in $(seq 100); do
    curl -sf -o /dev/null "$health" && return 0
    sleep 0.1
  done
  echo "$bin did not start (see $dir.log)" >&2; exit 1
}
stop() { kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
dev_stat() { if [ -r "/sys/block/$DEV/stat" ]; then cat "/sys/block/$DEV/stat"; else echo 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0; fi; }


measure() {   # measure NAME LABEL OHA-ARGS...: one timed load of build NAME, one result line
  local name=$1 label=$2; shift 2
  local c0 c1 d0 d1 s0 s1 rate
  c0=$(cpu_ticks); d0=$(dev_stat); s0=$(steal_ticks)
  rate=$("$OHA" -z "${SECS}s" --no-tui "$@" 2>&1 | awk '/Requests\/sec/ {print $2}')
  printf '%s\t%s\t%s\t%s\n' "$ROUND" "$label" "$name" "${rate:-0}" >> "$RESULTS"
  c1=$(cpu_ticks); d1=$(dev_stat); s1=$(steal_ticks)
  python3 - "$label" "$SECS" "${rate:-0}" "$c0" "$c1" "$(getconf CLK_TCK)" "$d0" "$d1" "$s0" "$s1" <<'PY'
import sys
label, secs, rate, c0, c1, hz, d0, d1, s0, s1 = sys.argv[1:11]
rate = float(rate)
n = max(rate * float(secs), 1.0)
cpu_us = (float(c1) - float(c0)) / float(hz) * 1e6 / n
a, b = [list(map(int, x.split())) for x in (d0, d1)]
writes = (b[4] - a[4]) / n
flushes = (b[15] - a[15]) / n if len(a) > 15 else 0.0
kib = (b[6] - a[6]) / 2 / n  # sectors of 512 bytes
steal = (float(s1) - float(s0)) / float(hz) / float(secs)  # cores taken by the hypervisor
print(f"{label:<40} {rate:>9.0f} req/s  {cpu_us:>7.1f} us CPU/req  {writes:.2f} writes/req  {kib:5.1f} KiB/req  {flushes:.3f} flushes/req  steal {steal:.2f} cores")
PY
}

touch_s3() {   # touch_s3 BASE URLS-FILE: S3's 1,000 actors touched once, their URLs written
  node "$ACTORS_MJS" urls --base "$1" --prefix s3 --count 1000 > "$2"
  node "$ACTORS_MJS" touch --base "$1" --prefix s3 --count 1000 --conc 64 > /dev/null
}

run() {   # run SCENARIO BIN
  local scenario=$1 bin=$2 dir="$DATA/run-$PORT"
  local name label b
  name=$(name_of "$bin")
  label="$scenario $name"
  start "$bin" "$dir"
  b=$(base "$bin")
  case "$scenario" in
    s1c*)
      local c=${scenario#s1c}
      "$OHA" -n 1000 -c 16 -m POST --no-tui "$b/alice/increment" > /dev/null
      measure "$name" "$label" -c "$c" -m POST "$b/alice/increment"
      ;;
    s2)
      measure "$name" "$label" -c 64 -m POST --rand-regex-url "$b/s2-[a-z0-9]{20}/increment"
      ;;
    s3)
      touch_s3 "$b" "$dir.urls"
      measure "$name" "$label" -c 64 -m POST --urls-from-file "$dir.urls"
      ;;
    s3long)
      touch_s3 "$b" "$dir.urls"
      for part in $(seq "${LONG_PARTS:-7}"); do
        measure "$name" "$label $((part * SECS))s" -c 64 -m POST --urls-from-file "$dir.urls"
      done
      ;;
    *) echo "unknown scenario $scenario" >&2; exit 1 ;;
  esac
  stop
  # Kept until the end: on ext4 without a journal, every file created in the
  # minutes after a large delete scans past the freed inodes (ADR 0027),
  # which would slow the runs that follow a deleted one.
  mv "$dir" "$DATA/done-$RUN"; rm -f "$dir.urls"; RUN=$((RUN + 1))
}

# Odd rounds run the builds in the order given, even rounds in reverse: on
# the disk the first run of a pair tends to find it faster (the other's
# writeback is still draining), which would otherwise favour one build.
BINS=("$@")
RESULTS="$DATA/results.tsv"
: > "$RESULTS"
for round in $(seq "$ROUNDS"); do
  ROUND=$round
  echo "round $round: cpu probe $(cpu_probe) ms (a fixed Python loop; lower is faster)"
  for scenario in $SCENARIOS; do
    if (( round % 2 == 1 )); then order=("${BINS[@]}"); else
      order=(); for (( i=${#BINS[@]}-1; i>=0; i-- )); do order+=("${BINS[$i]}"); done
    fi
    for bin in "${order[@]}"; do
      run "$scenario" "$bin"
    done
  done
done

# Each build's rate over the first build's, per scenario: round by round,
# and the median of the rounds.
if [ "${#BINS[@]}" -gt 1 ]; then
  python3 - "$RESULTS" "$(name_of "${BINS[0]}")" <<'PY'
import sys, statistics
from collections import defaultdict
path, first = sys.argv[1:3]
rates = defaultdict(dict)  # (scenario, build) -> round -> rate
for line in open(path):
    rnd, label, name, rate = line.rstrip("\n").split("\t")
    scenario = label.replace(f" {name}", "", 1)
    rates[(scenario, name)][rnd] = float(rate)
print(f"\nrate over {first}'s, round by round, then the median:")
for (scenario, name), by_round in rates.items():
    if name == first:
        continue
    base = rates.get((scenario, first), {})
    ratios = [by_round[r] / base[r] for r in by_round if base.get(r)]
    if ratios:
        shown = " ".join(f"{x:.2f}" for x in ratios)
        print(f"  {scenario:<14} {name:<20} {shown}   median {statistics.median(ratios):.2f}x")
PY
fi
