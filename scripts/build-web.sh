#!/usr/bin/env bash
# Builds the wasm package into pkg/ when a source changed since the last build.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
if [ -f pkg/pagedlm_bg.wasm ] && [ -z "$(find src shaders Cargo.toml Cargo.lock -newer pkg/pagedlm_bg.wasm -print -quit)" ]; then
  exit 0
fi
echo "build: wasm-pack build --target web"
wasm-pack --quiet build --target web --release --out-dir pkg 2>&1 | grep -v "failed to get wasm-pack version" || true
test -f pkg/pagedlm_bg.wasm
