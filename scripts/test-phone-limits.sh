#!/usr/bin/env bash
# Every test suite again, on a device whose limits are a phone's (DeviceLimits::Phone: WebGPU's
# default limits, 8 storage buffers per stage, 16 KiB of workgroup storage, 128 MiB bindings and
# buffers): natively, where the device is created with exactly those limits, and in headless
# Chromium. Outside `npm test`, which it would double; `npm test` runs tests/small_devices.rs.
# PAGEDLM_TEST_LIMITS=phone is read by the test build of the crate (feature `testing`): natively
# when the tests run, in the browser when they are compiled (so this rebuilds the browser suites,
# and the next plain run rebuilds them back). Ends with one summary line; README "Reliability".
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh || exit 1
export PATH="$HOME/.cargo/bin:$PATH"
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$(mktemp -d)}
export CARGO_TERM_COLOR=never PAGEDLM_TEST_LIMITS=phone
bash scripts/reencode-all.sh && bash scripts/fetch-gemma.sh --quiet || exit 1
port=${PAGEDLM_TEST_PORT:-18932}
PORT=$port node scripts/serve.mjs >/dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
export PAGEDLM_MODEL_URL="http://127.0.0.1:$port/models/SmolLM2-135M-Instruct.Q4_1.gguf"
native=$(mktemp)
browser=$(mktemp)
cargo test --no-fail-fast >"$native" 2>&1
native_rc=$?
CHROMEDRIVER=/usr/bin/chromedriver WASM_BINDGEN_TEST_TIMEOUT=1200 wasm-pack test --headless --chrome >"$browser" 2>&1
browser_rc=$?
grep -hE "^(test .* FAILED|test .* FAIL)$|panicked at" "$native" "$browser" | head -40
count() { grep -E "^test result" "$1" | awk '{p += $4; f += $6; n += 1} END {printf "%d suites, %d passed, %d failed", n, p, f}'; }
echo "phone limits, native (lavapipe): $(count "$native") (exit $native_rc); browser (SwiftShader): $(count "$browser") (exit $browser_rc)"
[ $native_rc -eq 0 ] && [ $browser_rc -eq 0 ]
