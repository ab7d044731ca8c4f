#!/usr/bin/env bash
# Native figures for the README, measured in one run on this machine:
#   1. pagedlm bench (512-token prompt, 128 generated) next to llama.cpp on the same GGUF;
#   2. decode cost per token against context length.
# Usage: bash bench/native.sh [extra pagedlm options]   (needs `cargo build --release`;
# llama.cpp from `pip install llama-cpp-python==0.3.36`, optional)
set -euo pipefail
cd "$(dirname "$0")/.."
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$(mktemp -d)}
bin=target/release/pagedlm
echo "# pagedlm vs llama.cpp"
$bin bench --backend "${BACKEND:-webgpu}" --prompt-tokens 512 --gen-tokens 128 --kv-layout contiguous "$@"
if python3 -c "import llama_cpp" 2>/dev/null; then
  python3 bench/llamacpp_peer.py --prompt-tokens 512 --gen-tokens 128
else
  echo '{"peer": "llama.cpp not installed (pip install llama-cpp-python==0.3.36)"}'
fi
echo "# decode cost against context"
for ctx in ${CONTEXTS:-128 512 1024 2048 4096}; do
  $bin bench --backend "${BACKEND:-webgpu}" --prompt-tokens 16 --context "$ctx" --gen-tokens 32 --kv-layout contiguous "$@"
done
