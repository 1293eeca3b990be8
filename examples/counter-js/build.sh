#!/usr/bin/env bash
# Builds the JavaScript counter (actor.js) into a component with
# componentize-js, against the same WIT as the Rust guests.
#
# Usage: examples/counter-js/build.sh OUT.wasm
# Needs node >= 18 and npm. The first run installs the pinned toolchain from
# package-lock.json into examples/counter-js/node_modules (~30 s, ~390 MB).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
out="${1:?usage: build.sh OUT.wasm}"
mkdir -p "$(dirname "$out")"
out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
if ! command -v npm >/dev/null 2>&1; then
  echo "counter-js: needs node >= 18 and npm" >&2
  exit 1
fi
cd "$HERE"
# npm ci installs exactly the lock. componentize-js is pinned (newer wizer
# releases' per-platform packages are not all published); preview2-shim is
# listed too because componentize-js 0.23.0 imports it without declaring it.
if ! [ -x node_modules/.bin/componentize-js ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund
fi
# http stays enabled: fetch() is wasi:http/outgoing-handler, which the host
# links (ADR 0066). fetch-event (an incoming-handler export) is not ours.
npx --no-install componentize-js actor.js --wit "$ROOT/wit" --world-name actor \
  --disable fetch-event -o "$out"
echo "counter-js: built $out ($(stat -c %s "$out") bytes)" >&2
