#!/usr/bin/env bash
# Builds a TypeScript example (examples/EXAMPLE/src/actor.ts: counter-js,
# chat-js) into a component with the TypeScript SDK (sdk/js, @wasmkeep/sdk):
# its wasmkeep-build bundles the actor with esbuild and builds the component
# with componentize-js against the same WIT as the Rust guests.
#
# Usage: examples/build-ts.sh EXAMPLE OUT.wasm
# Needs node >= 18 and npm. The first run installs the SDK's pinned toolchain
# from sdk/js/package-lock.json into sdk/js/node_modules (~30 s, ~420 MB);
# an example's own node_modules only links the SDK.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SDK="$ROOT/sdk/js"
example="${1:?usage: build-ts.sh EXAMPLE OUT.wasm}"
HERE="$ROOT/examples/$example"
[ -f "$HERE/src/actor.ts" ] || { echo "build-ts: no $HERE/src/actor.ts" >&2; exit 1; }
out="${2:?usage: build-ts.sh EXAMPLE OUT.wasm}"
mkdir -p "$(dirname "$out")"
out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
if ! command -v npm >/dev/null 2>&1; then
  echo "build-ts: needs node >= 18 and npm" >&2
  exit 1
fi
# npm ci installs exactly the lock (componentize-js is pinned: newer wizer
# releases' per-platform packages are not all published), then the SDK's
# TypeScript compiles to sdk/js/dist, which the example imports.
if ! [ -d "$SDK/node_modules" ] || [ "$SDK/package-lock.json" -nt "$SDK/node_modules/.package-lock.json" ]; then
  (cd "$SDK" && npm ci --no-audit --no-fund)
fi
(cd "$SDK" && npm run --silent build)
cd "$HERE"
if ! [ -e node_modules/.bin/wasmkeep-build ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund
fi
# Type-checks with tsconfig.json, bundles, componentizes (see sdk/js/README.md).
npx --no-install wasmkeep-build src/actor.ts -o "$out"
echo "$example: built $out ($(stat -c %s "$out") bytes)" >&2
