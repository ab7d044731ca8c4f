#!/usr/bin/env bash
# Builds the wasm package into pkg/ when a source changed since the last build: the engine with
# SIMD128 (pkg/pagedlm_bg.wasm, every browser with WebGPU), and the same code with relaxed SIMD
# too (pkg/pagedlm_relaxed_bg.wasm, its own target dir), which js/worker.js takes where the
# browser has relaxed SIMD. Both builds have the same imports and exports, so one JS glue serves
# both: the build fails if the two glues differ in more than comments (which number closures).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
if [ -f pkg/pagedlm_bg.wasm ] && [ -f pkg/pagedlm_relaxed_bg.wasm ] \
  && [ -z "$(find src shaders Cargo.toml Cargo.lock .cargo -newer pkg/pagedlm_relaxed_bg.wasm -print -quit)" ]; then
  exit 0
fi
build() {
  wasm-pack --quiet build --target web --release --out-dir "$1" 2>&1 | grep -v "failed to get wasm-pack version" || true
  test -f "$1/pagedlm_bg.wasm"
}
echo "build: wasm-pack build --target web (SIMD128, then relaxed SIMD)"
build pkg
relaxed=target/pkg-relaxed
rm -rf "$relaxed"
# RUSTFLAGS replaces .cargo/config.toml's flags for the wasm target: SIMD128 is named again.
CARGO_TARGET_DIR=target/relaxed RUSTFLAGS="-C target-feature=+simd128,+relaxed-simd" build "$relaxed"
code() { grep -v '^[[:space:]]*//' "$1"; }
if ! cmp -s <(code pkg/pagedlm.js) <(code "$relaxed/pagedlm.js"); then
  echo "build: the relaxed-SIMD build's JS glue differs from the SIMD128 build's" >&2
  diff <(code pkg/pagedlm.js) <(code "$relaxed/pagedlm.js") | head -20 >&2
  exit 1
fi
cp "$relaxed/pagedlm_bg.wasm" pkg/pagedlm_relaxed_bg.wasm
