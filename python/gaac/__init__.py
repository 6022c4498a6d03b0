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

FP8 caches (GAAC-FP8, docs/format.md section 14): ``compress`` and ``calibrate`` also take
``torch.float8_e4m3fn`` / ``torch.float8_e5m2`` tensors, or NumPy/torch ``uint8`` arrays of FP8 bytes
with ``format="e4m3"`` or ``"e5m2"``; ``convert_to_fp8`` makes them from BF16 as vLLM does.

>>> k8, v8, ks, vs = gaac.convert_to_fp8(k, v, "e4m3")
>>> snap8 = gaac.compress(k8, v8, format="e4m3", k_scales=ks, v_scales=vs)
>>> snap8.element_format, round(snap8.ratio, 1) > 1.0
('e4m3', True)
"""
from . import _gaac
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
    calibrate_chunk,
    chunk_object_bytes,
    convert_to_fp8,
    cuda_available,
    load_kv_dump,
    save_kv_dump,
    synthetic_kv,
)

__all__ = ["BatchKvCache", "CacheFullError", "Calibration", "ChunkCodec", "GaacError", "KvCache", "KvCacheMirror", "Snapshot",
           "attend", "calibrate", "calibrate_chunk", "chunk_object_bytes", "compress", "convert_to_fp8", "cuda_available",
           "load_kv_dump", "save_kv_dump", "synthetic_kv", "to_torch", "SNAPSHOT_VERSION", "TILE_FORMAT_VERSION"]

_FP8_FORMATS = ("e4m3", "e5m2")


def _torch_fp8_format(array):
    """'e4m3' / 'e5m2' for a torch float8 tensor, else None (torch is imported only if already loaded)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not isinstance(array, torch.Tensor):
        return None
    return {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}.get(array.dtype)


def _fp8_arrays(k, v, format, what):
    """(k, v, format) as uint8 arrays when the cache is FP8, else None: torch float8 tensors name their format
    (and are viewed as uint8, no copy); uint8 arrays need `format`."""
    k, v = list(k), list(v)
    first = k[0] if k else None
    tensor_format = _torch_fp8_format(first) if first is not None else None
    if tensor_format is not None:
        if format is not None and format != tensor_format:
            raise GaacError(f"{what}: format={format!r} but the tensors are {first.dtype}")
        import torch

        return [a.view(torch.uint8) for a in k], [a.view(torch.uint8) for a in v], tensor_format
    if format is None:
        return None
    if format not in _FP8_FORMATS:
        raise GaacError(f"{what}: format must be 'e4m3' or 'e5m2', got {format!r}")
    return k, v, format


def calibrate(k, v, *, format=None):
    """Learns exponent windows and slot capacities from a cache: `k` and `v` hold one array per layer,
    [tokens, kv_heads, head_dim] bfloat16 (a BF16 table), or FP8: torch float8 tensors, or uint8 arrays of FP8
    bytes with `format` 'e4m3' / 'e5m2' (an FP8 table)."""
    fp8 = _fp8_arrays(k, v, format, "calibrate")
    if fp8 is None:
        return _gaac.calibrate(k, v)
    return _gaac.calibrate_fp8(*fp8)


def compress(k, v, calibration=None, *, format=None, k_scales=None, v_scales=None):
    """Compresses a KV cache losslessly into a Snapshot: `k` and `v` hold one array per layer,
    [tokens, kv_heads, head_dim] bfloat16 (GAAC), or FP8 (GAAC-FP8): torch float8 tensors, or uint8 arrays of
    FP8 bytes with `format` 'e4m3' / 'e5m2', and optionally their per-layer scales (stored with them). Without
    `calibration` the windows are learnt on the values themselves. The image is byte for byte what
    `gaac compress` writes for the same values and calibration."""
    fp8 = _fp8_arrays(k, v, format, "compress")
    if fp8 is None:
        if k_scales is not None or v_scales is not None:
            raise GaacError("compress: scales belong to FP8 caches; these values are BF16")
        return _gaac.compress(k, v, calibration)
    return _gaac.compress_fp8(*fp8, calibration, k_scales, v_scales)


def to_torch(array, format=None):
    """Views a uint16 array of BF16 bit patterns (as gaac returns them) as a ``torch.bfloat16`` tensor,
    sharing its memory; with `format` 'e4m3' / 'e5m2', a uint8 array of FP8 bytes as a ``torch.float8_e4m3fn``
    / ``torch.float8_e5m2`` tensor. Raises ``TypeError`` for what is not a NumPy array and ``GaacError`` for an
    array of another dtype (a float32 array is values, not BF16 bit patterns: convert it with
    ``torch.from_numpy(a).bfloat16()``)."""
    import numpy
    import torch

    if not isinstance(array, numpy.ndarray):
        raise TypeError(f"to_torch: expected a NumPy array, got {type(array).__name__}")
    if format is not None:
        if format not in _FP8_FORMATS:
            raise GaacError(f"to_torch: format must be 'e4m3' or 'e5m2', got {format!r}")
        if array.dtype != numpy.uint8:
            raise GaacError(f"to_torch: expected a uint8 array of FP8 bytes for format={format!r}, got {array.dtype}")
        return torch.from_numpy(array).view(torch.float8_e4m3fn if format == "e4m3" else torch.float8_e5m2)
    if array.dtype != numpy.uint16:
        raise GaacError(f"to_torch: expected a uint16 array of BF16 bit patterns (as gaac returns them), got {array.dtype}")
    return torch.from_numpy(array).view(torch.bfloat16)
