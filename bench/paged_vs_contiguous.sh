#!/usr/bin/env bash
# Decode tokens/s with the paged pool against the contiguous baseline, side by side in one run.
# Usage: bash bench/paged_vs_contiguous.sh   (needs `cargo build --release`)
set -euo pipefail
cd "$(dirname "$0")/.."
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$(mktemp -d)}
for ctx in ${CONTEXTS:-128 512 2048 8000}; do
  for layout in contiguous paged; do
    target/release/pagedlm bench --backend "${BACKEND:-webgpu}" --prompt-tokens 16 --context "$ctx" --gen-tokens 32 --kv-layout "$layout" "$@"
  done
done
