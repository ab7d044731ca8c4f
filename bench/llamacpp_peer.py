#!/usr/bin/env python3
"""llama.cpp as a comparison peer on the same GGUF and machine (CPU, 2 threads).

    pip install llama-cpp-python==0.3.36   # builds from source, ~10 min; CMAKE_ARGS="-DGGML_NATIVE=OFF"
    python3 bench/llamacpp_peer.py [--model PATH] [--prompt-tokens 512] [--gen-tokens 128]

Prints one JSON line like `pagedlm bench`: prefill and decode tokens/s (median of --reps runs).
The prompt is the same deterministic token sequence `pagedlm bench` uses.
"""
import argparse
import json
import statistics
import time

from llama_cpp import Llama


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    llm = Llama(a.model, n_ctx=a.prompt_tokens + a.gen_tokens + 8, n_threads=a.threads, n_batch=512, verbose=False)
    vocab = llm.n_vocab()
    prompt = [100 + (i * 7919) % max(vocab - 200, 1) for i in range(a.prompt_tokens)]
    prefill, decode = [], []
    for _ in range(a.reps):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        prefill.append(a.prompt_tokens / (time.perf_counter() - t0))
        tok = int(llm._scores[-1].argmax())
        t1 = time.perf_counter()
        for _ in range(a.gen_tokens):
            llm.eval([tok])
            tok = int(llm._scores[-1].argmax())
        decode.append(a.gen_tokens / (time.perf_counter() - t1))
    print(json.dumps({
        "peer": "llama.cpp (llama-cpp-python, CPU)",
        "threads": a.threads,
        "prefill_tok_s": statistics.median(prefill),
        "decode_tok_s": statistics.median(decode),
        "prompt_tokens": a.prompt_tokens,
        "gen_tokens": a.gen_tokens,
    }))


if __name__ == "__main__":
    main()
