#!/usr/bin/env python3
"""Re-encodes a GGUF model's weight matrices into one ggml type, with llama.cpp's own library.

Usage: reencode.py IN OUT TYPE      (TYPE: F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1)

Every 2-D tensor (the linear layers and the embedding) is dequantized with
`gguf.quants.dequantize` and quantized again into TYPE with `gguf.quants.quantize`; 1-D tensors
(the norms) are copied as they are. Every metadata key keeps its value and value type (arrays
their element type), in the input's order; `general.file_type` becomes TYPE's llama.cpp ftype.
Tensors keep their order. The output depends only on the input: numpy's quantizers have no
randomness and the writer no timestamps, so the same input gives the same bytes.

The output is written beside OUT and renamed into place; nothing is done when OUT is already
newer than both IN and this script.

Needs the PyPI packages gguf (0.19.0) and numpy: scripts/py-env.sh makes a venv with them.
"""

import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf import LlamaFileType as F

# The types `gguf.quants` can quantize into, with llama.cpp's `general.file_type` for a file
# whose matrices are all of that type.
FILE_TYPES = {
    "F16": (T.F16, F.MOSTLY_F16),
    "BF16": (T.BF16, F.MOSTLY_BF16),
    "Q8_0": (T.Q8_0, F.MOSTLY_Q8_0),
    "Q4_0": (T.Q4_0, F.MOSTLY_Q4_0),
    "Q4_1": (T.Q4_1, F.MOSTLY_Q4_1),
    "Q5_0": (T.Q5_0, F.MOSTLY_Q5_0),
    "Q5_1": (T.Q5_1, F.MOSTLY_Q5_1),
}


def up_to_date(src: str, out: str) -> bool:
    if not os.path.exists(out):
        return False
    newest_input = max(os.path.getmtime(src), os.path.getmtime(__file__))
    return os.path.getmtime(out) > newest_input


def copy_metadata(reader: gguf.GGUFReader, writer: gguf.GGUFWriter, file_type: int) -> None:
    for field in reader.fields.values():
        # The writer writes the architecture itself (first) and the GGUF.* header fields.
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        if field.name == gguf.Keys.General.FILE_TYPE:
            writer.add_key_value(field.name, int(file_type), vtype)
        else:
            writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub_type)
    if gguf.Keys.General.FILE_TYPE not in reader.fields:
        writer.add_key_value(gguf.Keys.General.FILE_TYPE, int(file_type), gguf.GGUFValueType.UINT32)
    alignment = reader.fields.get(gguf.Keys.General.ALIGNMENT)
    if alignment is not None:
        writer.data_alignment = int(alignment.contents())


def reencode(src: str, out: str, type_name: str) -> None:
    qtype, file_type = FILE_TYPES[type_name]
    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    tmp = out + ".part"
    writer = gguf.GGUFWriter(tmp, arch)
    copy_metadata(reader, writer, file_type)
    for tensor in reader.tensors:
        if len(tensor.shape) == 2:
            # numpy order: [rows, cols] (ggml's dims reversed).
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            data = gguf.quants.quantize(np.ascontiguousarray(values, dtype=np.float32), qtype)
            writer.add_tensor(tensor.name, data, raw_dtype=qtype)
        else:
            # Norms: the raw bytes and type as they are (the reader's shape is in ggml order).
            shape = list(reversed([int(d) for d in tensor.shape]))
            writer.add_tensor(tensor.name, tensor.data, raw_shape=shape, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, out)


def main() -> int:
    if len(sys.argv) != 4 or sys.argv[3] not in FILE_TYPES:
        print(f"usage: {sys.argv[0]} IN OUT TYPE   (TYPE: {', '.join(FILE_TYPES)})", file=sys.stderr)
        return 2
    src, out, type_name = sys.argv[1:]
    if up_to_date(src, out):
        return 0
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    reencode(src, out, type_name)
    print(f"reencode: wrote {out} ({type_name}, {os.path.getsize(out):,} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
