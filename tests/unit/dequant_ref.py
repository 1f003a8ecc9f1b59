"""gguf-py reference for tests/unit/test_quant.cpp.

  dequant_ref.py dequant TYPE IN.bin ROWS OUT.npy   raw blocks -> float32 (ROWS, n) .npy
  dequant_ref.py quant TYPE IN.npy OUT.bin          float32 .npy -> raw blocks
TYPE is a GGMLQuantizationType name (Q4_0, Q6_K, F16, ...).
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize


def main() -> None:
    mode, name = sys.argv[1], sys.argv[2]
    qtype = GGMLQuantizationType[name]
    if mode == "dequant":
        rows = int(sys.argv[4])
        raw = np.fromfile(sys.argv[3], dtype=np.uint8).reshape(rows, -1)
        np.save(sys.argv[5], np.ascontiguousarray(dequantize(raw, qtype), dtype=np.float32))
    elif mode == "quant":
        x = np.load(sys.argv[3]).astype(np.float32)
        with open(sys.argv[4], "wb") as f:
            f.write(np.ascontiguousarray(quantize(x, qtype)).tobytes())
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
