# Shared by the bench scripts that drive built binaries with the harness's
# tools (compare-builds.sh, icount.sh). Source it after setting ROOT.

HARNESS="$ROOT/bench-results/harness"
OHA="$HARNESS/tools/oha/bin/oha"
ACTORS_MJS="$HARNESS/bench/actors.mjs"
[ -x "$OHA" ] && [ -f "$ACTORS_MJS" ] || { echo "run bench/vs-workerd.sh once first (it sets up oha and actors.mjs)" >&2; exit 1; }

# name_of BIN: how a build is labelled among BINS: the file's name, or its
# folder's when the builds share a file name (several builds all called
# wasmkeep). The peer (`workerd`) is itself.
name_of() {
  local names
  [ "$1" = workerd ] && { echo workerd; return; }
  names=$(for b in "${BINS[@]}"; do basename "$b"; done | sort | uniq -d)
  if [ -n "$names" ]; then basename "$(dirname "$1")"; else basename "$1"; fi
}

# cpu_probe: milliseconds this machine takes for a fixed single-threaded
# piece of work (a Python loop, best of three), printed next to results:
# wasmkeep is CPU-bound in the peer benchmark's rate scenarios while workerd
# is bound by the disk's flush, and this VM's CPU speed moves by up to 2x
# within an hour (ADR 0047) as its disk's flush latency does.
cpu_probe() {
  python3 - <<'PY'
import time
best = None
for _ in range(3):
    t = time.perf_counter()
    s = 0
    for i in range(1_000_000):
        s += i * i
    ms = (time.perf_counter() - t) * 1000
    best = ms if best is None else min(best, ms)
print(f"{best:.0f}")
PY
}

# steal_ticks: the hypervisor's steal time so far, all CPUs (USER_HZ ticks).
steal_ticks() { awk '/^cpu / {print $9}' /proc/stat; }
