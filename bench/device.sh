#!/usr/bin/env bash
# The speed figures on a machine with a real GPU, as one prepared run that prints one JSON line
# per figure (`{"figure": ..., "adapter": ..., ...pagedlm's own line}`): natively through Vulkan
# (and the GPU's Chromium when one is installed, BROWSER=1).
#
# Needs: the release binary (`cargo build --release`, or carried in as target/release/pagedlm),
# the model file(s) under models/ (`npm run fetch-model`; MODELS= to choose), a Vulkan driver.
# Nothing is downloaded. Usage: bash bench/device.sh   (GEN=, PROMPT=, CONTEXTS=, MODELS=, CLASSES= to change)
set -uo pipefail
cd "$(dirname "$0")/.."
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$(mktemp -d)}
bin=${PAGEDLM:-target/release/pagedlm}
if [ ! -x "$bin" ]; then
  cargo build --release --quiet --offline 2>/dev/null || cargo build --release --quiet || { echo '{"error": "no release binary and no way to build one"}'; exit 1; }
fi
MODELS=${MODELS:-models/SmolLM2-135M-Instruct.Q4_1.gguf models/gemma-3-270m-q4_k_m.gguf}
PROMPT=${PROMPT:-512}
GEN=${GEN:-128}
# One line per figure; a figure that fails prints its error instead of stopping the run.
figure() {
  local name=$1 model=$2; shift 2
  local line
  if line=$("$bin" "$@" --backend "${BACKEND:-webgpu}" --model "$model" 2>&1 | tail -n 1) && [ "${line:0:1}" = "{" ]; then
    echo "{\"figure\": \"$name\", \"model\": \"$(basename "$model")\", \"result\": $line}"
  else
    printf '{"figure": "%s", "model": "%s", "error": %s}\n' "$name" "$(basename "$model")" "$(printf '%s' "$line" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))' 2>/dev/null || echo '"failed"')"
  fi
}
for model in $MODELS; do
  [ -f "$model" ] || { echo "{\"figure\": \"missing\", \"model\": \"$model\"}"; continue; }
  figure profile "$model" profile --prompt-tokens "$PROMPT"
  figure prefill_and_decode "$model" bench --prompt-tokens "$PROMPT" --gen-tokens "$GEN"
  for ctx in ${CONTEXTS:-128 4096}; do
    figure "decode_ctx$ctx" "$model" bench --prompt-tokens 16 --context "$ctx" --gen-tokens "$GEN"
  done
  figure decode_batch8 "$model" bench --batch 8 --context 128 --gen-tokens "$GEN"
  figure decode_no_lookahead "$model" bench --prompt-tokens 16 --context 128 --gen-tokens "$GEN" --no-lookahead
  figure decode_int8_kv "$model" bench --prompt-tokens 16 --context 128 --gen-tokens "$GEN" --kv-dtype int8
  figure decode_int8_activations "$model" bench --prompt-tokens 16 --context 128 --gen-tokens "$GEN" --activations int8
  # The kernel variants side by side: the adapter's own class is in every line's "variant"; each
  # class forced, and without the optional features (subgroups, shader-f16).
  for class in ${CLASSES:-cpu integrated discrete}; do
    figure "variant_${class}_prefill_and_decode" "$model" bench --prompt-tokens "$PROMPT" --gen-tokens "$GEN" --adapter-class "$class"
  done
  figure variant_no_optional_features "$model" bench --prompt-tokens "$PROMPT" --gen-tokens "$GEN" --no-optional-features
done
if [ "${BROWSER:-0}" = 1 ] && [ -f pkg/pagedlm_bg.wasm ]; then
  echo "{\"figure\": \"browser\", \"result\": $(BENCH_ONLY_SPEED=1 node bench/browser.mjs)}"
fi
