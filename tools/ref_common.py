"""GGUF reading and the element-wise numerics that every architecture of reference.py shares.

Importing this module pins NumPy and OpenBLAS to their AVX2 paths, so it must come before
anything else imports NumPy."""

from __future__ import annotations

import math
import os
import sys

# The same arithmetic on every x86-64 machine: NumPy's AVX-512 loops and OpenBLAS's per-CPU
# kernels round differently from the AVX2 ones (on SmolLM2 at 1,390 tokens the reference moved
# by 6.7e-3 between the two, as much as it differs from the engine); pinned to the AVX2 paths.
# Must be set before NumPy is imported.
os.environ.setdefault("NPY_DISABLE_CPU_FEATURES", "X86_V4 AVX512_ICL AVX512_SPR")
os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")

import numpy as np  # noqa: E402

try:
    import gguf
    from gguf import GGMLQuantizationType as QT
    from gguf import quants as gquants
except ImportError as e:  # pragma: no cover
    sys.stderr.write("reference.py: the 'gguf' package is required (%s)\n" % e)
    sys.exit(2)


def log(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


# --------------------------------------------------------------------------
# GGUF reading helpers
# --------------------------------------------------------------------------

def field_value(reader: "gguf.GGUFReader", key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    try:
        return f.contents()
    except Exception:  # older gguf versions
        if not f.data:
            return default
        part = f.parts[f.data[0]]
        if f.types and f.types[0] == gguf.GGUFValueType.STRING:
            return bytes(part).decode("utf-8")
        return part.tolist()[0]


def dequant_tensor(t) -> np.ndarray:
    """Return the tensor as float32 numpy array with shape reversed(gguf dims)."""
    shape = tuple(int(d) for d in reversed(list(t.shape)))
    qtype = QT(int(t.tensor_type))
    if qtype == QT.F32:
        arr = np.asarray(t.data, dtype=np.float32)
    elif qtype == QT.F16:
        arr = np.asarray(t.data).view(np.float16).astype(np.float32)
    else:
        arr = gquants.dequantize(np.asarray(t.data), qtype).astype(np.float32, copy=False)
    arr = np.ascontiguousarray(arr.reshape(shape), dtype=np.float32)
    return arr


# --------------------------------------------------------------------------
# numerics
# --------------------------------------------------------------------------

def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    ms = np.mean(x64 * x64, axis=-1, keepdims=True)
    return (x * (1.0 / np.sqrt(ms + eps)).astype(np.float32)) * w


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return np.float32(1.0) / (np.float32(1.0) + np.exp(-x))


def softplus(x: np.ndarray) -> np.ndarray:
    """ggml_softplus: log(1 + exp(x)), x itself above 20."""
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))).astype(np.float32)


def l2_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """The GDN's l2norm over the last axis, as transformers' and llama.cpp's: x / sqrt(||x||^2 +
    eps), the sum in f64."""
    x64 = x.astype(np.float64)
    ss = np.sum(x64 * x64, axis=-1, keepdims=True).astype(np.float32)
    return x * (np.float32(1.0) / np.sqrt(ss + np.float32(eps)))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    c = np.float32(math.sqrt(2.0 / math.pi))
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


def round_kv(x: np.ndarray, kv_type: str) -> np.ndarray:
    """x: (..., head_dim) float32; emulate storage type of the KV cache."""
    if kv_type == "f32":
        return x
    if kv_type == "f16":
        return x.astype(np.float16).astype(np.float32)
    if kv_type == "bf16":
        u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
        rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000))
        return rounded.view(np.float32)
    if kv_type == "q8_0":
        hd = x.shape[-1]
        if hd % 32:
            raise ValueError("q8_0 KV emulation needs head_dim multiple of 32")
        flat = np.ascontiguousarray(x.reshape(-1, hd), dtype=np.float32)
        q = gquants.quantize(flat, QT.Q8_0)
        return gquants.dequantize(q, QT.Q8_0).astype(np.float32).reshape(x.shape)
    raise ValueError("unknown kv type %r" % kv_type)
