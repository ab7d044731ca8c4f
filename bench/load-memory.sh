#!/usr/bin/env bash
# Peak memory of a native load of a big model (issue 39): writes the 2.4 GB synthetic llama
# (examples/write_tiny_model --target-bytes, from a seed, deleted after), runs
#   /usr/bin/time -v target/release/pagedlm bench --model BIG --backend B --prompt-tokens 16 --gen-tokens 4
# for B = cpu and webgpu, and prints one JSON line: the file's size and, per backend, the peak RSS
# ("Maximum resident set size") against its bound (CPU: file + 512 MiB; WebGPU: 512 MiB).
# On lavapipe (no GPU) the "device memory" wgpu uploads to is host memory, so the WebGPU RSS
# includes the weights there (on a real GPU it would not): its bound is checked on the RSS less
# the GPU bytes bench reports (weights, KV, graphs).
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

# One backend's run: /usr/bin/time's report in $dir/B.err, bench's line in $dir/B.out.
run() {
  local rc=0
  /usr/bin/time -v target/release/pagedlm bench --model "$dir/big.gguf" --backend "$1" --prompt-tokens 16 --gen-tokens 4 \
    >"$dir/$1.out" 2>"$dir/$1.err" || rc=$?
  echo "$rc" >"$dir/$1.rc"
}
run cpu
run webgpu

# On lavapipe the GPU memory the engine reports (weights, KV, graphs) is host memory too: the
# WebGPU bound applies to the RSS without it.
python3 - "$dir" "$size" <<'PY'
import json, re, sys
dir, size = sys.argv[1], int(sys.argv[2])
MiB = 1 << 20
out = {"file_bytes": size}
for backend in ("cpu", "webgpu"):
    err = open(f"{dir}/{backend}.err").read()
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", err).group(1)) * 1024
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", err).group(1)
    lines = open(f"{dir}/{backend}.out").read().strip().splitlines()
    rc = int(open(f"{dir}/{backend}.rc").read())
    bench = json.loads(lines[-1]) if rc == 0 and lines else {"error": err.strip().splitlines()[0] if err.strip() else "no output"}
    r = {"peak_rss_bytes": rss, "exit": rc, "wall": wall}
    if backend == "cpu":
        r.update(bound_bytes=size + 512 * MiB, within=rss <= size + 512 * MiB)
    else:
        gpu = sum(bench.get(k, 0) for k in ("weights_bytes", "kv_bytes", "graph_bytes"))
        r.update(gpu_bytes=gpu, rss_without_gpu_bytes=rss - gpu, bound_bytes=512 * MiB, within=rss - gpu <= 512 * MiB)
    r["bench"] = bench
    out[backend] = r
out["note"] = "lavapipe: the WebGPU device memory is host memory, so its RSS includes the weights; the 512 MiB bound is checked on the RSS without the GPU bytes the engine reports"
print(json.dumps(out))
PY
