#!/usr/bin/env python3
"""llama.cpp as a comparison peer on the same GGUF and machine (CPU, 2 threads).

A benchmark peer only, never a test dependency. Install it into a venv that bench/peers.sh finds:

    python3 -m venv .cache/peer
    .cache/peer/bin/pip install llama-cpp-python==0.3.36   # builds llama.cpp, ~10 min; CMAKE_ARGS="-DGGML_NATIVE=OFF"
    #   or a wheel built for the machine: .cache/peer/bin/pip install ../shared/wheels/llama_cpp_python-0.3.36-*.whl
    .cache/peer/bin/python bench/llamacpp_peer.py [--model PATH] [--prompt-tokens 512] [--gen-tokens 128]
                                                  [--context N] [--batch N] [--reps 3]

Measures what `pagedlm bench` measures with the same flags, on the same token ids, and prints one
JSON line with the same keys (`prefill_tok_s`, `decode_tok_s`, median of --reps runs):
- prefill: --prompt-tokens ids as one sequence, llama_decode'd n_batch (512) at a time;
- decode: after --context tokens of history (default: the prompt), --gen-tokens greedy steps,
  timed from the first token on, as `pagedlm bench` times them;
- --batch N: N sequences, each with its own max(--context, --prompt-tokens)-token prompt (ids
  salted as pagedlm's), decode together: one llama_batch of N tokens per step (llama.cpp's batched
  decoding, what its `batched` example does); aggregate tokens/s over every sequence's tokens
  after all of them have their first.
One code path for all three: a single sequence is a batch of one. llama.cpp's own context defaults
(flash attention "auto", f16 KV) stand, except the sizes and threads set here.
"""
import argparse
import ctypes
import json
import logging
import statistics
import time

import numpy as np
import llama_cpp as lc


def bench_ids(n, vocab, salt=0):
    """The deterministic prompt `pagedlm bench` uses (ids cycle through a mid-vocabulary range)."""
    return [100 + (i * 7919 + salt * 104_729) % max(vocab - 200, 1) for i in range(n)]


class Peer:
    def __init__(self, model_path, n_ctx, n_seq, threads, n_batch=512):
        lc.llama_backend_init()
        mparams = lc.llama_model_default_params()
        self.model = lc.llama_model_load_from_file(model_path.encode(), mparams)
        if not self.model:
            raise SystemExit(f"llama.cpp could not load {model_path}")
        cparams = lc.llama_context_default_params()
        # Without a unified KV buffer each sequence gets n_ctx / n_seq cells, and attends only to
        # its own (the faster choice for sequences that share nothing, llama.h says).
        cparams.n_ctx = n_ctx * n_seq
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_batch
        cparams.n_seq_max = n_seq
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        self.ctx = lc.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise SystemExit("llama.cpp could not make a context")
        self.flash_attn = {-1: "auto", 0: "off", 1: "on"}.get(int(cparams.flash_attn_type), str(cparams.flash_attn_type))
        self.vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        self.n_batch = n_batch
        self.batch = lc.llama_batch_init(max(n_batch, n_seq), 0, 1)

    def _decode(self, rows):
        """rows: [(token, pos, seq, wants_logits)], at most n_batch. Returns the greedy next token of each row that wants logits."""
        b = self.batch
        for i, (tok, pos, seq, logits) in enumerate(rows):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = logits
        b.n_tokens = len(rows)
        if lc.llama_decode(self.ctx, b) != 0:
            raise SystemExit("llama_decode failed (context too small?)")
        out = []
        for i, (_, _, _, logits) in enumerate(rows):
            if logits:
                row = np.ctypeslib.as_array(lc.llama_get_logits_ith(self.ctx, i), shape=(self.vocab,))
                out.append(int(row.argmax()))
        return out

    def prefill(self, ids, seq):
        """Evaluates ids as sequence seq from position 0; returns the first generated token."""
        first = None
        for start in range(0, len(ids), self.n_batch):
            chunk = ids[start:start + self.n_batch]
            last = start + len(chunk) == len(ids)
            rows = [(t, start + j, seq, last and j == len(chunk) - 1) for j, t in enumerate(chunk)]
            got = self._decode(rows)
            if last:
                first = got[0]
        return first

    def run(self, prompts, gen_tokens):
        """Prefills every prompt (one sequence each), then decodes gen_tokens steps of all of them
        together. Returns (prefill seconds of the first prompt, decode seconds, decoded tokens)."""
        lc.llama_memory_clear(lc.llama_get_memory(self.ctx), True)
        toks, prefill_s = [], 0.0
        for seq, ids in enumerate(prompts):
            t0 = time.perf_counter()
            toks.append(self.prefill(ids, seq))
            if seq == 0:
                prefill_s = time.perf_counter() - t0
        pos = [len(p) for p in prompts]
        t0 = time.perf_counter()
        for _ in range(gen_tokens):
            toks = self._decode([(t, pos[s], s, True) for s, t in enumerate(toks)])
            pos = [p + 1 for p in pos]
        return prefill_s, time.perf_counter() - t0, gen_tokens * len(prompts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--context", type=int, default=0, help="decode after this many tokens of history (default: the prompt)")
    ap.add_argument("--batch", type=int, default=1, help="sequences decoding together")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--verbose", action="store_true", help="llama.cpp's own log on stderr")
    a = ap.parse_args()
    # llama-cpp-python forwards llama.cpp's log to this logger, everything by default.
    logging.getLogger("llama-cpp-python").setLevel(logging.DEBUG if a.verbose else logging.ERROR)
    if a.batch < 1 or a.gen_tokens < 1 or a.prompt_tokens < 1:
        ap.error("--batch, --gen-tokens and --prompt-tokens must be at least 1")
    decode_ctx = a.context or a.prompt_tokens
    batched = a.batch > 1
    if batched:
        decode_ctx = max(decode_ctx, a.prompt_tokens)
    peer = Peer(a.model, max(a.prompt_tokens, decode_ctx) + a.gen_tokens + 16, a.batch, a.threads)
    # Warm-up, the size of pagedlm bench's: pages in the weights and sizes llama.cpp's buffers.
    peer.run([bench_ids(8 if batched else 16, peer.vocab, 1000 + s) for s in range(a.batch)], 3)
    prefill, decode = [], []
    for _ in range(a.reps):
        if batched:
            _, secs, n = peer.run([bench_ids(decode_ctx, peer.vocab, salt) for salt in range(a.batch)], a.gen_tokens)
            decode.append(n / secs)
            continue
        secs, _, _ = peer.run([bench_ids(a.prompt_tokens, peer.vocab)], 1)
        prefill.append(a.prompt_tokens / secs)
        _, secs, n = peer.run([bench_ids(decode_ctx, peer.vocab)], a.gen_tokens)
        decode.append(n / secs)
    print(json.dumps({
        "peer": f"llama.cpp {lc.__version__} (llama-cpp-python, CPU)",
        "threads": a.threads,
        "prefill_tok_s": statistics.median(prefill) if prefill else None,
        "decode_tok_s": statistics.median(decode),
        "prompt_tokens": a.prompt_tokens,
        "gen_tokens": a.gen_tokens,
        "context": decode_ctx,
        "batch": a.batch,
        "reps": a.reps,
        "flash_attn_type": peer.flash_attn,
    }))


if __name__ == "__main__":
    main()
