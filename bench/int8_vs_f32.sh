#!/usr/bin/env bash
# Decode tokens/s with the INT8 KV cache against f32, side by side in one run, at growing context.
# Usage: bash bench/int8_vs_f32.sh   (needs `cargo build --release`; CONTEXTS="512 2048 8000" by default)
set -euo pipefail
cd "$(dirname "$0")/.."
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$(mktemp -d)}
for ctx in ${CONTEXTS:-512 2048 8000}; do
  for dtype in f32 int8; do
    target/release/pagedlm bench --backend "${BACKEND:-webgpu}" --prompt-tokens 16 --context "$ctx" --kv-dtype "$dtype" --max-context 8192 --gen-tokens 32 "$@"
  done
done
