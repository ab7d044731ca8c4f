#!/usr/bin/env python3
"""Prefix-cache figures, each measured with and without the cache in one run of `pagedlm trace`:

1. Time to first token of every turn of an 8-turn conversation whose history passes 1,500 tokens.
2. Hit rate and pool memory for 8 conversations that share one system prompt (two turns each).
3. The same 8 first turns arriving together and running as one batch (`--max-batch 8`): sharing
   the system prompt while it is being computed (cache-aware admission, the default) against
   admitting all 8 at once (`--no-cache-aware`) and against no prefix cache.

Usage: python3 bench/prefix_cache.py [extra pagedlm options]   (needs `cargo build --release`)
       ONLY_CONCURRENT=1 python3 bench/prefix_cache.py          (figure 3 alone)
"""
import json, os, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "pagedlm")
extra = sys.argv[1:]

readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
SYSTEM = "You are a helpful assistant. Answer questions about this document.\n\n" + readme[:3000]
QUESTIONS = [
    "What does pagedlm do, in one sentence?",
    "Which two commands set everything up?",
    "Why is the KV cache paged instead of contiguous?",
    "What does the prefix cache share between conversations?",
    "How is the model file fetched, and from where?",
    "Which GPUs do the tests run on?",
    "What limits decode speed on a software GPU?",
    "Summarize the whole document in three short bullet points.",
]


def trace(lines, *opts):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write("\n".join(json.dumps(l) for l in lines) + "\n")
        path = f.name
    env = dict(os.environ, XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", tempfile.mkdtemp()))
    out = subprocess.run([BIN, "trace", "--input", path, "--max-context", "2048", *opts, *extra],
                         check=True, capture_output=True, text=True, env=env).stdout
    os.unlink(path)
    rows = [json.loads(l) for l in out.splitlines() if l.strip()]
    return rows[:-1], rows[-1]["summary"]


ONLY_CONCURRENT = bool(os.environ.get("ONLY_CONCURRENT"))

# 1. One long conversation.
if not ONLY_CONCURRENT:
    turns = [{"id": f"t{i + 1}", "conversation": "doc", "user": q, "max_tokens": 64} for i, q in enumerate(QUESTIONS)]
    turns[0]["system"] = SYSTEM
    cached, _ = trace(turns)
    plain, _ = trace(turns, "--no-prefix-cache")
    print("turn  prompt  hit   prefill  ttft_cached_ms  ttft_plain_ms  speedup  same_tokens")
    for c, p in zip(cached, plain):
        print(f"{c['id']:>4}  {c['prompt_tokens']:>6}  {c['prefix_hit_tokens']:>4}  {c['prefill_tokens']:>7}  "
              f"{c['ttft_ms']:>14.0f}  {p['ttft_ms']:>13.0f}  {p['ttft_ms'] / c['ttft_ms']:>6.1f}x  {c['tokens'] == p['tokens']}")

    # 2. Eight conversations sharing one system prompt, two turns each (interleaved).
    shared = []
    for turn in range(2):
        for c in range(8):
            line = {"id": f"c{c}.{turn}", "conversation": f"c{c}", "user": QUESTIONS[(c + turn * 3) % 8], "max_tokens": 24}
            if turn == 0:
                line["system"] = SYSTEM
            shared.append(line)
    for label, opts in [("with prefix cache", ()), ("without", ("--no-prefix-cache",))]:
        rows, s = trace(shared, *opts)
        pool = s["pool"]
        held = pool["blocks_total"] - pool["blocks_free"]
        print(json.dumps({
            "run": f"8 conversations sharing a system prompt, {label}",
            "requests": s["requests"], "prompt_tokens": s["prompt_tokens"], "prefix_hit_tokens": s["prefix_hit_tokens"],
            "hit_rate": round(s["prefix_hit_tokens"] / s["prompt_tokens"], 3),
            "blocks_held_at_end": held, "kv_mb_held_at_end": round(held * pool["block_size"] * pool["bytes_per_token"] / 1e6, 1),
            "tokens_in_the_8_histories": sum(r["prompt_tokens"] + len(r["tokens"]) for r in rows if r["id"].endswith(".1")),
            "evictions": s["evictions"], "integrity_ok": s["integrity_ok"],
            "prefill_s_total": round(sum(r["ttft_ms"] for r in rows) / 1000, 1),
        }))

# 3. Eight first turns arriving together, one batch.
together = [{"id": f"c{c}.0", "conversation": f"c{c}", "system": SYSTEM, "user": QUESTIONS[c % 8], "max_tokens": 16} for c in range(8)]
reference = None
for label, opts in [("shared while computed (cache-aware)", ()), ("all admitted at once (--no-cache-aware)", ("--no-cache-aware",)),
                    ("no prefix cache", ("--no-prefix-cache",))]:
    t0 = time.time()
    rows, s = trace(together, "--max-batch", "8", *opts)
    wall = time.time() - t0
    tokens = {r["id"]: r["tokens"] for r in rows}
    reference = reference or tokens
    print(json.dumps({
        "run": f"8 requests together, {label}", "prompt_tokens": s["prompt_tokens"],
        "prefilled": sum(r["prefill_tokens"] for r in rows), "prefix_hit_tokens": s["prefix_hit_tokens"],
        "ttft_s_mean": round(sum(r["ttft_ms"] for r in rows) / len(rows) / 1000, 1),
        "ttft_s_max": round(max(r["ttft_ms"] for r in rows) / 1000, 1),
        "wall_s": round(wall, 1), "same_tokens": tokens == reference,
        "integrity_ok": s["integrity_ok"],
    }))
