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
