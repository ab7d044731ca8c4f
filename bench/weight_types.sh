#!/usr/bin/env bash
# Figures per weight type for the README: SmolLM2 in each type (the Q4_1 file, its re-encodings by
# scripts/reencode-all.sh and pagedlm's K-quant ones), natively (`pagedlm bench`: prefill and decode
# tok/s, GPU bytes of the weights) and, with BROWSER=1, in headless Chromium (bench/browser.mjs).
# Usage: bash bench/weight_types.sh [TYPE ...]   (needs `cargo build --release`; BROWSER=1 needs pkg/)
set -euo pipefail
cd "$(dirname "$0")/.."
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$(mktemp -d)}
TYPES=${*:-Q4_1 F16 BF16 Q8_0 Q4_0 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K}
bash scripts/reencode-all.sh
if [ ! -f models/reencoded/SmolLM2-135M-Instruct.Q6_K.gguf ]; then
  cargo test --release --quiet --test reencoded -- --ignored write_kquant_files >/dev/null
fi
file() { if [ "$1" = Q4_1 ]; then echo models/SmolLM2-135M-Instruct.Q4_1.gguf; else echo "models/reencoded/SmolLM2-135M-Instruct.$1.gguf"; fi; }
for t in $TYPES; do
  f=$(file "$t")
  line=$(target/release/pagedlm bench --backend "${BACKEND:-webgpu}" --model "$f" --prompt-tokens ${PROMPT:-128} --gen-tokens ${GEN:-32} --kv-layout contiguous)
  echo "{\"type\": \"$t\", \"file_bytes\": $(stat -c %s "$f"), \"native\": $line}"
  if [ "${BROWSER:-0}" = 1 ]; then
    echo "{\"type\": \"$t\", \"chromium\": $(BENCH_MODEL=${f#models/} BENCH_ONLY_SPEED=1 BENCH_PREFILL_WORDS=${WORDS:-40} BENCH_DECODE_TOKENS=${GEN:-16} node bench/browser.mjs)}"
  fi
done
