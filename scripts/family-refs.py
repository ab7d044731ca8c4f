#!/usr/bin/env python3
"""References for tests/families.rs: llama.cpp's greedy steps and logits on the synthetic model of
each architecture beyond SmolLM2's llama and Gemma 3 (pagedlm::synth::family_model; written by
the `write_tiny_model --arch NAME` example), teacher-forced.

For each model: 8 prompt ids drawn from a seeded generator, then 40 greedy steps, each a
one-token decode in llama.cpp (F32 weights and an F32 KV cache, no flash attention, so llama.cpp
multiplies the activations themselves). Writes tests/data/families/NAME.json: the ids, and the
logits of every position from the last prompt token on, as little-endian f32 base64.

Run with the Python that has llama-cpp-python (llama.cpp's bindings; ../shared/wheels holds the
build this project's references come from):
    cargo build --features testing --example write_tiny_model
    PYTHON scripts/family-refs.py [target/debug/examples/write_tiny_model]
"""
import base64, json, os, subprocess, sys, tempfile

import llama_cpp
import numpy as np

# (reference, model, context): phi3-short runs the phi3 model within its original context (256),
# where LongRoPE takes the short factors; every other at 512, past it.
RUNS = [("qwen2", "qwen2", 512), ("qwen3", "qwen3", 512), ("llama3", "llama3", 512), ("phi3", "phi3", 512),
        ("phi3-short", "phi3", 256), ("gemma2", "gemma2", 512), ("smollm3", "smollm3", 512)]
PROMPT, STEPS, SEED = 8, 40, 20261206

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
writer = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "target/debug/examples/write_tiny_model")
out_dir = os.path.join(root, "tests/data/families")
os.makedirs(out_dir, exist_ok=True)

with tempfile.TemporaryDirectory() as tmp:
    for i, (name, arch, n_ctx) in enumerate(RUNS):
        path = os.path.join(tmp, f"{arch}.gguf")
        subprocess.run([writer, path, "--arch", arch], check=True)
        llm = llama_cpp.Llama(
            model_path=path, n_ctx=n_ctx, n_batch=n_ctx, n_threads=2, logits_all=True, verbose=False,
            type_k=0, type_v=0, flash_attn=False, seed=SEED,
        )
        vocab = llm.n_vocab()
        rng = np.random.default_rng(SEED + i)
        ids = [int(t) for t in rng.integers(3, vocab, PROMPT)]
        rows = []
        llm.eval(ids)
        for _ in range(STEPS):
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            rows.append(logits)
            tok = int(np.argmax(logits))
            ids.append(tok)
            llm.eval([tok])
        rows.append(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32))
        blob = base64.b64encode(np.stack(rows).astype("<f4").tobytes()).decode()
        ref = {
            "oracle": "llama.cpp via llama-cpp-python, greedy, one-token decode steps",
            "versions": {"llama_cpp_python": llama_cpp.__version__},
            "settings": {"n_ctx": n_ctx, "type_k": "f32", "type_v": "f32", "flash_attn": False, "seed": SEED},
            "model": arch,
            "vocab": vocab,
            "ids": ids[: PROMPT + STEPS],
            "from": PROMPT,
            "logits_f32_base64": blob,
        }
        with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
            json.dump(ref, f, indent=1)
            f.write("\n")
        print(name, "ok", len(rows), "rows")
