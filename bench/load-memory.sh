#!/usr/bin/env bash
# Peak memory of a native load of a big model (issue 39): writes the 2.4 GB synthetic llama
# (examples/write_tiny_model --target-bytes, from a seed, deleted after), runs
#   /usr/bin/time -v target/release/pagedlm bench --model BIG --backend B --prompt-tokens 16 --gen-tokens 4
# for B = cpu and webgpu, and prints one JSON line: the file's size and, per backend, the peak RSS
# ("Maximum resident set size") against its bound (CPU: file + 512 MiB; WebGPU: 512 MiB).
# On lavapipe (no GPU) the "device memory" wgpu uploads to is host memory, so the WebGPU RSS
# includes the weights there; on a real GPU it would not.
# Usage: bash bench/load-memory.sh   (BIG_MODEL_BYTES=N for another size; builds what it runs)
set -euo pipefail
cd "$(dirname "$0")/.."
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$(mktemp -d)}
bytes=${BIG_MODEL_BYTES:-2400000000}
dir=$(mktemp -d "${TMPDIR:-/tmp}/pagedlm-load-memory-XXXXXX")
trap 'rm -rf "$dir"' EXIT

cargo build --quiet --release
cargo build --quiet --release --features testing --example write_tiny_model
target/release/examples/write_tiny_model --target-bytes "$bytes" --seed 39 --out "$dir/big.gguf" >"$dir/written.json"
size=$(stat -c %s "$dir/big.gguf")

# One backend's result as JSON: peak RSS, its bound, wall time, exit code, bench's line or error.
measure() {
  local backend=$1 bound=$2 rc=0
  /usr/bin/time -v target/release/pagedlm bench --model "$dir/big.gguf" --backend "$backend" --prompt-tokens 16 --gen-tokens 4 \
    >"$dir/$backend.out" 2>"$dir/$backend.err" || rc=$?
  local rss_kib wall bench
  rss_kib=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$dir/$backend.err")
  wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$dir/$backend.err")
  bench=$(tail -n 1 "$dir/$backend.out")
  if [ "$rc" -ne 0 ] || [ -z "$bench" ]; then
    bench=$(grep -v -E '^\s|Command being timed' "$dir/$backend.err" | tail -n 1 | sed 's/\\/\\\\/g; s/"/\\"/g')
    bench="{\"error\": \"$bench\"}"
  fi
  local rss=$((rss_kib * 1024))
  local within=false
  [ "$rss" -le "$bound" ] && within=true
  printf '{"peak_rss_bytes": %d, "bound_bytes": %d, "within": %s, "exit": %d, "wall": "%s", "bench": %s}' \
    "$rss" "$bound" "$within" "$rc" "$wall" "$bench"
}

mib=$((1024 * 1024))
cpu=$(measure cpu $((size + 512 * mib)))
webgpu=$(measure webgpu $((512 * mib)))
printf '{"file_bytes": %d, "cpu": %s, "webgpu": %s, "note": "lavapipe: device memory is host memory, so the webgpu RSS includes the weights"}\n' \
  "$size" "$cpu" "$webgpu"
