#!/usr/bin/env python3
"""Writes the GGML block test vectors under tests/data/quant/ with llama.cpp's own Python library.

For every weight type pagedlm computes with, `<TYPE>.blocks` holds raw blocks and `<TYPE>.f32`
their dequantization by `gguf.quants.dequantize` (little-endian f32). For the types `gguf`
quantizes (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), `<TYPE>.input.f32` holds values whose
`gguf.quants.quantize` are the first blocks of `<TYPE>.blocks`; the blocks after those are random
bytes with a sane f16 scale, so the dequantizers also see bit patterns no quantizer makes. The
K-quants (which `gguf` cannot quantize) are random bytes with their f16 super-block scales `d`
and `dmin` overwritten by values in 0.001..0.1.

Deterministic (fixed seed). Usage (see tests/data/quant/README.md):
    python3 -m venv /tmp/qv && /tmp/qv/bin/pip install gguf==0.19.0 numpy
    /tmp/qv/bin/python scripts/quant_vectors.py [out_dir]
"""

import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

SEED = 20240514
QUANTIZED_BLOCKS = 32  # blocks of 32 values made by gguf's quantizer (legacy types)
RANDOM_BLOCKS = 8  # blocks of random bytes (legacy types)
K_BLOCKS = 8  # random super-blocks of 256 values (K-quants)
FLOAT_VALUES = 1024

LEGACY = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
FLOATS = [T.F32, T.F16, T.BF16]
# Byte offsets of the f16 scales each K-quant block carries (ggml's block_qN_K structs).
K_SCALE_OFFSETS = {T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]}
# Offsets of the f16 d (and m) in the legacy blocks.
LEGACY_SCALE_OFFSETS = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0]}


def block_values(rng: np.random.Generator, n_blocks: int) -> np.ndarray:
    """n_blocks blocks of 32 values: varied ranges and offsets, plus the edge cases."""
    scales = 10.0 ** rng.uniform(-3, 2, size=(n_blocks, 1))
    offsets = rng.uniform(-1, 1, size=(n_blocks, 1)) * rng.integers(0, 2, size=(n_blocks, 1))
    v = (rng.standard_normal((n_blocks, 32)) + offsets) * scales
    v[0] = 0.0  # all zeros: d = 0
    v[1] = rng.standard_normal(32) * 0.01
    v[1, 7] = 40.0  # one outlier
    v[2] = -3.25  # constant: max == min
    v[3] = rng.uniform(-1, 1, 32)
    v[3, 5], v[3, 20] = 1.5, -1.5  # a tie in |max|: the first one wins
    v[4] = rng.uniform(0.5, 2.0, 32)  # all positive
    v[5] = -rng.uniform(0.5, 2.0, 32)  # all negative
    return v.astype(np.float32)


def float_values(rng: np.random.Generator) -> np.ndarray:
    """Values for the float types: varied magnitudes, subnormals, overflow, signed zeros, ties."""
    v = rng.standard_normal(FLOAT_VALUES) * 10.0 ** rng.uniform(-8, 5, FLOAT_VALUES)
    v = v.astype(np.float32)
    special = np.array([0.0, -0.0, 1.0, -1.0, 65504.0, 65520.0, 1e5, -1e5, 6e-8, 3e-8, 1e-45, np.inf, -np.inf,
                        1.0 + 2**-11, 1.0 + 3 * 2**-11, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 3.0e38], dtype=np.float32)
    v[: len(special)] = special
    return v


def random_blocks(rng: np.random.Generator, qtype: T, n_blocks: int, scale_offsets: list[int]) -> np.ndarray:
    """Random block bytes whose f16 scales are overwritten by sane values (0.001..0.1, random sign for d
    of the symmetric legacy types)."""
    _, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for i, off in enumerate(scale_offsets):
        s = rng.uniform(0.001, 0.1, n_blocks)
        if qtype in LEGACY and i == 1:
            s = s - 0.05  # a Q4_1/Q5_1 minimum may be either sign
        elif qtype in (T.Q4_0, T.Q5_0, T.Q8_0):
            s = s * rng.choice([-1.0, 1.0], n_blocks)
        blocks[:, off : off + 2] = s.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return blocks


def write(out: Path, name: str, arr: np.ndarray) -> None:
    (out / name).write_bytes(np.ascontiguousarray(arr).tobytes())


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "tests" / "data" / "quant"
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    for qtype in FLOATS + LEGACY + list(K_SCALE_OFFSETS):
        if qtype in FLOATS:
            values = float_values(rng)
            blocks = gguf.quants.quantize(values, qtype).view(np.uint8).reshape(-1)
        elif qtype in LEGACY:
            values = block_values(rng, QUANTIZED_BLOCKS).reshape(-1)
            quantized = gguf.quants.quantize(values, qtype).reshape(-1)
            extra = random_blocks(rng, qtype, RANDOM_BLOCKS, LEGACY_SCALE_OFFSETS[qtype]).reshape(-1)
            blocks = np.concatenate([quantized, extra])
        else:
            values = None
            blocks = random_blocks(rng, qtype, K_BLOCKS, K_SCALE_OFFSETS[qtype]).reshape(-1)
        dequantized = gguf.quants.dequantize(blocks, qtype).astype(np.float32, copy=False).reshape(-1)
        if values is not None:
            write(out, f"{qtype.name}.input.f32", values)
        write(out, f"{qtype.name}.blocks", blocks)
        write(out, f"{qtype.name}.f32", dequantized)
        print(f"{qtype.name}: {blocks.size} bytes -> {dequantized.size} values")


if __name__ == "__main__":
    main()
