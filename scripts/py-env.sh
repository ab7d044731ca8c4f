#!/usr/bin/env bash
# Makes the Python environment the re-encoded model tests need: a venv at .cache/py with the
# PyPI packages `gguf` (llama.cpp's own GGUF library) and numpy, pinned so that the re-encoded
# files are the same bytes on every machine. Idempotent; prints nothing
# when the environment is already there. Prints the venv's python path with --print.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.cache/py
# Bump the stamp's content when the pinned set changes: the venv is then brought up to date.
WANT="gguf==0.19.0 numpy==2.4.6"
stamp=$VENV/.pagedlm-packages
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$WANT" ]; then
  echo "py-env: making $VENV ($WANT from PyPI)" >&2
  python3 -m venv "$VENV"
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check $WANT
  echo "$WANT" >"$stamp"
fi
if [ "${1:-}" = --print ]; then
  echo "$PWD/$VENV/bin/python"
fi
