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
# The browser golden test fetches the real model from a local static server.
port=${PAGEDLM_TEST_PORT:-18931}
PORT=$port node scripts/serve.mjs >/dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
export PAGEDLM_MODEL_URL="http://127.0.0.1:$port/models/SmolLM2-135M-Instruct.Q4_1.gguf"
CHROMEDRIVER=/usr/bin/chromedriver WASM_BINDGEN_TEST_TIMEOUT=${WASM_BINDGEN_TEST_TIMEOUT:-600} \
  wasm-pack test --headless --chrome 2>&1 | grep -v "failed to get wasm-pack version"

echo "== end-to-end (the chat page, the npm package from its tarball, its TypeScript types; headless Chromium)"
bash scripts/build-web.sh
npm run --silent test:e2e
