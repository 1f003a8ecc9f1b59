#!/usr/bin/env python3
"""Writes a copy of a GGUF file with every tensor dequantized to f32 (the metadata as is, the
file type set to all-F32). Run through llama.cpp, the copy gives the quantized file's weights
with full-precision activations: what a quantized file computes without llama.cpp's rounding of
the activations to 8 bits before each quantized matrix product.

  dequant.py IN.gguf OUT.gguf
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize


def field_value(f):
    t = f.types[0]
    if t == GGUFValueType.ARRAY:
        sub = f.types[1] if len(f.types) > 1 else GGUFValueType.INT32
        if sub == GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data], sub
        return [f.parts[i].tolist()[0] for i in f.data], sub
    if t == GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8"), None
    return f.parts[f.data[0]].tolist()[0], None


def main():
    src, dst = sys.argv[1], sys.argv[2]
    r = GGUFReader(src)
    arch = field_value(r.fields["general.architecture"])[0]
    w = GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value, sub = field_value(f)
        if name == "general.file_type":
            value = 0  # LLAMA_FTYPE_ALL_F32
        t = f.types[0]
        if t == GGUFValueType.ARRAY:
            w.add_key_value(name, value, t, sub_type=sub)
        else:
            w.add_key_value(name, value, t)
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type).astype(np.float32)
        a = a.reshape([int(x) for x in reversed(t.shape)])
        w.add_tensor(t.name, a, raw_dtype=GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
