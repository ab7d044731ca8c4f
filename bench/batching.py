#!/usr/bin/env python3
"""Continuous-batching figures, each a comparison within one run:

1. Aggregate decode tokens/s at 1, 2, 4, 8 and 16 concurrent sequences (`pagedlm bench --batch N`).
2. Inter-token latency of 4 decoding sequences while a 1,536-token prompt arrives, with chunked
   prefill (64 rows per step) and without (the whole prompt in one step).
3. Cache-aware admission on and off: a trace of 24 conversations over 3 system prompts, two turns
   each, 4 sequences at a time: prefix hit rate and requests per second.

Usage: python3 bench/batching.py [extra pagedlm options]   (needs `cargo build --release`)
"""
import json, os, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "pagedlm")
ENV = dict(os.environ, XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", tempfile.mkdtemp()))
extra = sys.argv[1:]


def run(*args):
    out = subprocess.run([BIN, *args, *extra], check=True, capture_output=True, text=True, env=ENV).stdout
    return [json.loads(l) for l in out.splitlines() if l.strip()]


base = None
for n in ([] if os.environ.get("SKIP_BATCH") else [1, 2, 4, 8, 16]):
    r = run("bench", "--batch", str(n), "--prompt-tokens", "64", "--gen-tokens", "48")[0]
    base = base or r["decode_tok_s"]
    print(json.dumps({"batch": n, "decode_tok_s": round(r["decode_tok_s"], 1), "vs_one": round(r["decode_tok_s"] / base, 2)}))

for step in [64, 4096]:
    r = run("bench", "--interference", "--prompt-tokens", "1536", "--step-tokens", str(step))[0]
    print(json.dumps({k: (round(v, 1) if isinstance(v, float) else v) for k, v in r.items() if k != "adapter"}))

readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
systems = [readme[i * 900:(i + 1) * 900] for i in range(3)]
lines = []
for turn in range(2):
    for c in range(24):
        line = {"id": f"c{c}.{turn}", "conversation": f"c{c}", "user": f"Question {turn} from {c}: what is this about?", "max_tokens": 8}
        if turn == 0:
            line["system"] = systems[c % 3]
        lines.append(line)
with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
    f.write("\n".join(json.dumps(l) for l in lines) + "\n")
    path = f.name
for label, opts in [("cache-aware admission", ()), ("FIFO admission", ("--no-cache-aware",))]:
    # A pool of 2,048 tokens cannot keep all three system prompts and every conversation.
    t0 = time.time()
    rows = run("trace", "--input", path, "--max-batch", "4", "--pool-tokens", "2048", "--max-context", "2048", *opts)
    s = rows[-1]["summary"]
    print(json.dumps({"run": label, "hit_rate": round(s["prefix_hit_tokens"] / s["prompt_tokens"], 3),
                      "requests_per_s": round(s["requests"] / (time.time() - t0), 2), "evictions": s["evictions"],
                      "preemptions": s["preemptions"], "integrity_ok": s["integrity_ok"]}))
os.unlink(path)
