"""gaac: lossless compression of the BF16 key/value cache of language models (GAAC).

Each BF16 element keeps its sign and mantissa in one byte; exponents are coded per group of eight as
3-bit or 4-bit offsets from calibrated per-channel bases, or raw; complete 16-token blocks become
fixed-size slots. Every bit comes back.

K and V are given as lists with one array per layer, each ``[tokens, kv_heads, head_dim]`` of BF16:
a ``torch.bfloat16`` tensor, or a NumPy ``uint16`` array of BF16 bit patterns (any DLPack producer on
the CPU, any strides). Results are NumPy ``uint16`` arrays of BF16 bit patterns; ``to_torch`` views
one as a ``torch.bfloat16`` tensor without copying.

>>> import gaac
>>> k, v = gaac.synthetic_kv(layers=2, kv_heads=2, head_dim=128, tokens=1000)
>>> snap = gaac.compress(k, v)                 # calibrated on the values themselves
>>> round(snap.ratio, 2) > 1.3
True
>>> k2, v2 = snap.decompress()
>>> all((a == b).all() for a, b in zip(k + v, k2 + v2))
True
"""
from ._gaac import (  # noqa: F401
    SNAPSHOT_VERSION,
    TILE_FORMAT_VERSION,
    BatchKvCache,
    CacheFullError,
    Calibration,
    ChunkCodec,
    GaacError,
    KvCache,
    KvCacheMirror,
    Snapshot,
    attend,
    calibrate,
    calibrate_chunk,
    chunk_object_bytes,
    compress,
    cuda_available,
    load_kv_dump,
    save_kv_dump,
    synthetic_kv,
)

__all__ = ["BatchKvCache", "CacheFullError", "Calibration", "ChunkCodec", "GaacError", "KvCache", "KvCacheMirror", "Snapshot",
           "attend", "calibrate", "calibrate_chunk", "chunk_object_bytes", "compress", "cuda_available", "load_kv_dump", "save_kv_dump", "synthetic_kv", "to_torch",
           "SNAPSHOT_VERSION", "TILE_FORMAT_VERSION"]


def to_torch(array):
    """Views a uint16 array of BF16 bit patterns (as gaac returns them) as a ``torch.bfloat16`` tensor,
    sharing its memory. Raises ``TypeError`` for what is not a NumPy array and ``GaacError`` for an array
    of another dtype (a float32 array is values, not BF16 bit patterns: convert it with
    ``torch.from_numpy(a).bfloat16()``)."""
    import numpy
    import torch

    if not isinstance(array, numpy.ndarray):
        raise TypeError(f"to_torch: expected a NumPy array, got {type(array).__name__}")
    if array.dtype != numpy.uint16:
        raise GaacError(f"to_torch: expected a uint16 array of BF16 bit patterns (as gaac returns them), got {array.dtype}")
    return torch.from_numpy(array).view(torch.bfloat16)
