#!/usr/bin/env bash
# Makes the re-encoded SmolLM2 files that tests/reencoded.rs runs: the Q4_1 model's weight
# matrices in each type `gguf` can quantize into, at models/reencoded/SmolLM2-135M-Instruct.TYPE.gguf
# (git-ignored). Deterministic; a file already newer than the model and scripts/reencode.py is
# kept. Prints nothing when every file is there. Usage: reencode-all.sh [TYPE ...]
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
TYPES=${*:-F16 BF16 Q8_0 Q4_0 Q5_0 Q5_1}
[ -f "$MODEL" ] || bash scripts/fetch-model.sh --quiet
missing=()
for type in $TYPES; do
  out=models/reencoded/SmolLM2-135M-Instruct.$type.gguf
  if ! { [ "$out" -nt "$MODEL" ] && [ "$out" -nt scripts/reencode.py ]; }; then
    missing+=("$type")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0
python=$(bash scripts/py-env.sh --print)
for type in "${missing[@]}"; do
  "$python" scripts/reencode.py "$MODEL" "models/reencoded/SmolLM2-135M-Instruct.$type.gguf" "$type"
done
