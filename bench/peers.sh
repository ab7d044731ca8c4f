#!/usr/bin/env bash
# pagedlm against its peers on the same GGUF, side by side in one run (issue 16's figures):
#   native:  `pagedlm bench` (Vulkan; lavapipe without a GPU) vs llama.cpp CPU (bench/llamacpp_peer.py);
#   browser: the npm package in headless Chromium (WebGPU; SwiftShader) vs wllama 2.x and 3.x (llama.cpp
#            in wasm, CPU) in the same page, the faster of the two compared.
# Decode at contexts 128 and 4,096, prefill of 512 tokens, aggregate decode of 8 sequences; per figure
# the runs alternate (pagedlm, peer, pagedlm, peer, ...) and one JSON line comes out:
#   {"figure": "native_decode_ctx128", "pagedlm": tok/s, "peer": tok/s, "peer_name": "llama.cpp 0.3.36 (2 threads)",
#    "ratio": median of the pairs' pagedlm/peer, "pairs": n, "runs": {...}, ...}
# Progress goes to stderr. Benchmarks, not tests: run them on a quiet machine.
#
# Usage: bash bench/peers.sh [all|native|browser]        (or npm run bench:peers)
# Env:   MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf (any GGUF both sides load, e.g. models/gemma-3-270m-q4_k_m.gguf)
#        PAIRS=3  GEN=64 (decoded tokens per run; at 8, `pagedlm bench --batch` still reports 0, use >= 16)
#        PREFILL=512  CONTEXTS="128 4096"  BATCH=8  BATCH_CONTEXT=128
#        THREADS=2 (the peers' threads)  FIGURES="decode_ctx128 prefill" (only figures whose name holds one)
#        WLLAMA="2 3"  PAGEDLM_ARGS="--kv-dtype int8" (extra `pagedlm bench` flags)  PEER_PYTHON=python with llama_cpp
#        BACKEND=webgpu (pagedlm's backend, here by default; the CLI's and the package's own default is auto)
#        The CPU backend (issue 19): BACKEND=cpu; natively THREADS=2 both sides, in the browser one thread
#        of wasm, so THREADS=1 for the same thread count
# Peers (optional: a missing one is reported in the line, pagedlm is still measured):
#   llama.cpp: python3 -m venv .cache/peer && .cache/peer/bin/pip install llama-cpp-python==0.3.36
#              (builds llama.cpp, ~10 min; or a wheel built for the machine); found at .cache/peer, or PEER_PYTHON.
#   wllama:    devDependencies (`@wllama/wllama` 3.x, `wllama-v2` = 2.x), installed by npm ci; served from
#              node_modules by scripts/serve.mjs, so nothing is fetched from elsewhere at run time.
# A full run on SmolLM2 takes long in the browser: the context-4,096 figure first prefills 4,096 tokens
# once per runtime (their prompt caches then hold them); CONTEXTS="128" leaves it out.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$(mktemp -d)}
side=${1:-all}
case "$side" in all | native | browser) ;; *) echo "usage: bash bench/peers.sh [all|native|browser]" >&2; exit 2 ;; esac

bash scripts/bootstrap.sh
if [ "$side" != browser ]; then
  cargo build --release --quiet --bin pagedlm
  if [ -z "${PEER_PYTHON:-}" ]; then
    if [ -x .cache/peer/bin/python ]; then PEER_PYTHON=$PWD/.cache/peer/bin/python; else PEER_PYTHON=python3; fi
  fi
  export PEER_PYTHON
fi
if [ "$side" != native ]; then
  bash scripts/build-web.sh
fi
exec node bench/peers.mjs "$side"
