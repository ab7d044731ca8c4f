#!/usr/bin/env bash
# Every test: native (lavapipe) then in headless Chromium (SwiftShader WebGPU).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$(mktemp -d)}
export CARGO_TERM_COLOR=never

echo "== native tests (Vulkan: $(command -v vulkaninfo >/dev/null && vulkaninfo --summary 2>/dev/null | awk -F= '/deviceName/{print $2; exit}' || echo lavapipe))"
cargo test --quiet 2>&1

echo "== browser tests (headless Chromium, WebGPU)"
CHROMEDRIVER=/usr/bin/chromedriver WASM_BINDGEN_TEST_TIMEOUT=${WASM_BINDGEN_TEST_TIMEOUT:-600} \
  wasm-pack --quiet test --headless --chrome 2>&1 | grep -v "failed to get wasm-pack version"
