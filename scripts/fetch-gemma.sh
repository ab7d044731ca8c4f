#!/usr/bin/env bash
# Kept for callers of the old name: the same as `bash scripts/fetch-model.sh gemma3-270m [--quiet]`.
exec bash "$(dirname "$0")/fetch-model.sh" gemma3-270m "$@"
