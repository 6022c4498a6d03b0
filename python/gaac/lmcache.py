"""gaac as an LMCache serde: lossless compression of the KV chunks LMCache stores and moves.

LMCache (multiprocess mode) can wrap any of its L2 adapters (file system, S3, Redis, ...) with a serde
that turns each chunk ``[2, layers, tokens, kv_heads * head_dim]`` (bfloat16, K then V) into the bytes
the adapter stores, and back. This module registers one named ``gaac`` when it is imported: each chunk
becomes one KV chunk object (docs/format.md, section 15), self-describing and checksummed, about 1/1.40
of the BF16 bytes, every bit restored; coded on the CPU (``threads`` threads per chunk) or, for chunks in
GPU memory, on the GPU.

Configuration of an L2 adapter (``lmcache server --l2-adapter '<json>'``)::

    {"type": "fs", "base_path": "/cache",
     "serde": {"type": "gaac", "calibration": "/cache/llama-3.1-8b.calibration.safetensors"}}

and LMCache started with this module imported, e.g. ``python -m gaac.lmcache server ...`` (LMCache's
own command line, run after ``import gaac.lmcache``) instead of ``lmcache server ...``.

Keyword arguments of the ``serde`` entry:

``calibration`` (required)
    A gaac calibration table (``gaac calibrate`` over KV dumps of the model, or ``gaac.Calibration.save``).
    Objects record its id; one read with another table is an error, never wrong values.
``learn`` (default false)
    When the table does not exist yet: learn it from the first chunk stored (``gaac.calibrate_chunk``),
    write it to ``calibration`` (the first process to write it wins; the others use its table) and
    keep it. Windows learnt on the first tokens of one prompt fit later positions less well (RoPE
    drift); a table from ``gaac calibrate`` over long prompts is better.
``head_dim``
    Channels per head: LMCache's layout gives ``kv_heads * head_dim`` only. Taken from the table; needed
    when learning.
``object_ratio`` (default 1.38)
    Every object of a chunk size takes exactly BF16 bytes / object_ratio, in whole 4 KiB pages (for
    O_DIRECT): LMCache 0.5's adapters read back exactly the bytes ``estimate_serialized_size`` gives, so
    objects of their own (smaller) size are not loaded by them. A chunk that does not fit is not stored
    (LMCache logs the failed serialize and keeps it in L1). ``0``: objects of their own size, and
    ``estimate_serialized_size`` the most one can take, for adapters that load objects of any size.
``threads`` (default min(4, CPUs))
    CPU threads coding one chunk.
``max_workers`` (default 1)
    Tasks coded at once (the ``AsyncSerdeProcessor`` pool; gaac releases the GIL while it works). A task's
    chunks in GPU memory are coded as one batch (``GaacSerdeProcessor``): the GPU's work of up to 8 chunks is
    enqueued before the host waits, once, for all of them.
"""
from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading

import torch
from lmcache.v1.distributed.serde import (
    AsyncSerdeProcessor,
    Deserializer,
    Serializer,
    get_registered_serde_types,
    register_serde_factory,
)

import gaac

logger = logging.getLogger(__name__)

SERDE_TYPE = "gaac"
DEFAULT_OBJECT_RATIO = 1.38
_KWARGS = ("calibration", "learn", "head_dim", "object_ratio", "threads", "max_workers")


def object_key(key) -> str:
    """The identity an object records of the LMCache ObjectKey it is stored under (model, rank, group,
    chunk hash, salt), so that an object read under another key is refused."""
    return f"{key.model_name}@{key.kv_rank:#x}@{key.object_group_id:x}@{key.chunk_hash.hex()}@{key.cache_salt}"


def _capsules(tensors):
    """DLPack capsules of the tensors, for the codec's batch calls: a CUDA tensor's own __dlpack__ (what the
    binding calls for a tensor) costs several times more than torch.utils.dlpack.to_dlpack, and a batch hands
    over two arrays a chunk."""
    return [torch.utils.dlpack.to_dlpack(t) for t in tensors]


def _raw_bytes(obj):
    """``raw_data[: get_size()]`` of a valid memory object whose raw data is a 1-D uint8 tensor (LMCache's
    TensorMemoryObj: its logical bytes, as its MemoryObj documents for a narrowed size), else None."""
    raw = getattr(obj, "raw_data", None)
    if isinstance(raw, torch.Tensor) and raw.dtype == torch.uint8 and raw.dim() == 1 and obj.is_valid():
        return raw[: obj.get_size()]
    return None


def object_bytes(obj):
    """The bytes of a memory object that holds (or receives) a stored object, as a 1-D uint8 tensor: one slice of
    its raw data (_raw_bytes), where ``.tensor`` builds three views; ``.tensor`` flattened for a memory object
    without raw uint8 data (None if it has no tensor)."""
    raw = _raw_bytes(obj)
    if raw is not None:
        return raw
    tensor = obj.tensor
    return None if tensor is None else tensor.view(-1)


def chunk_data(obj):
    """What the codec is handed of a memory object holding (or receiving) a chunk: its dense bytes (one slice,
    _raw_bytes; gaac.ChunkCodec reads them as a chunk of its calibration's geometry, so the object's layout must
    be checked first: GaacSerde.check_chunks), or ``.tensor`` for a memory object without raw uint8 data."""
    raw = _raw_bytes(obj)
    return raw if raw is not None else obj.tensor


def chunk_shape(shapes, dtypes, head_dim):
    """(layers, tokens, kv_heads) of an LMCache layout: one bfloat16 tensor [2, layers, tokens, kv_heads *
    head_dim]. Raises ValueError for any other layout (MLA, several kernel groups, another dtype)."""
    if len(shapes) != 1:
        raise ValueError(f"gaac serde: a chunk of {len(shapes)} kernel groups; gaac takes one [2, layers, tokens, hidden]")
    shape, dtype = tuple(shapes[0]), dtypes[0]
    if dtype != torch.bfloat16:
        raise ValueError(f"gaac serde: chunks of {dtype}; gaac is lossless for bfloat16 KV only")
    if len(shape) != 4 or shape[0] != 2:
        raise ValueError(f"gaac serde: a chunk of shape {list(shape)}; gaac takes [2 (K, V), layers, tokens, hidden]")
    if head_dim is None:
        raise ValueError("gaac serde: head_dim unknown (give 'head_dim' or a calibration table)")
    if shape[3] % head_dim:
        raise ValueError(f"gaac serde: rows of {shape[3]} channels are not heads of {head_dim}")
    return shape[1], shape[2], shape[3] // head_dim


class GaacSerde:
    """What the serializer and deserializer share: the calibration (loaded, or learnt once) and the codec."""

    def __init__(self, calibration, learn=False, head_dim=None, object_ratio=DEFAULT_OBJECT_RATIO, threads=None):
        if not isinstance(calibration, (str, os.PathLike)) or not str(calibration):
            raise ValueError("gaac serde: 'calibration' (a path to a gaac calibration table) is required")
        self.path = os.fspath(calibration)
        self.learn = bool(learn)
        self.head_dim = None if head_dim is None else int(head_dim)
        self.object_ratio = float(object_ratio)
        self.threads = int(threads) if threads is not None else max(1, min(4, os.cpu_count() or 1))
        self._lock = threading.Lock()
        self._codec = None
        self.geometry = None  # (layers, kv_heads) of the calibration, once the codec is made
        if os.path.exists(self.path):
            self._use(gaac.Calibration.load(self.path))
        elif not self.learn:
            raise FileNotFoundError(f"gaac serde: no calibration table at {self.path} (make one with `gaac calibrate`, "
                                    "or set 'learn': true to learn it from the first chunk stored)")
        elif self.head_dim is None:
            raise ValueError("gaac serde: 'head_dim' is needed to learn a calibration")
        # Checks the options before the first chunk comes (raises GaacError for a bad ratio).
        gaac.chunk_object_bytes(1, 1, self.head_dim or 128, 16, self.object_ratio)

    def _use(self, calibration):
        if self.head_dim is not None and calibration.head_dim != self.head_dim:
            raise ValueError(f"gaac serde: the calibration at {self.path} has head_dim {calibration.head_dim}, "
                             f"not {self.head_dim}")
        self.head_dim = calibration.head_dim
        self.geometry = (calibration.layers, calibration.kv_heads)
        self._codec = gaac.ChunkCodec(calibration, threads=self.threads, object_ratio=self.object_ratio)

    def codec(self, chunk=None):
        """The codec; while learning, the first chunk given (a CPU or CUDA tensor) makes it."""
        if self._codec is not None:
            return self._codec
        with self._lock:
            if self._codec is None:
                if os.path.exists(self.path):
                    self._use(gaac.Calibration.load(self.path))
                elif chunk is None:
                    raise gaac.GaacError(f"gaac serde: no calibration yet ({self.path} is learnt from the first chunk stored)")
                else:
                    self._use(self._learnt(gaac.calibrate_chunk(chunk.cpu(), self.head_dim)))
        return self._codec

    def _learnt(self, calibration):
        """Writes a learnt table to the path unless another process did first; returns the table kept."""
        directory = os.path.dirname(os.path.abspath(self.path))
        fd, temporary = tempfile.mkstemp(prefix=".gaac-calibration-", suffix=".safetensors", dir=directory)
        os.close(fd)
        try:
            calibration.save(temporary)
            try:
                os.link(temporary, self.path)  # fails if the table exists: the first one written wins
            except FileExistsError:
                return gaac.Calibration.load(self.path)
            return calibration
        finally:
            os.unlink(temporary)

    def estimate(self, layout_desc) -> int:
        layers, tokens, kv_heads = chunk_shape(layout_desc.shapes, layout_desc.dtypes, self.head_dim)
        return gaac.chunk_object_bytes(layers, kv_heads, self.head_dim, tokens, self.object_ratio)

    def serialize(self, src, dst, key) -> int:
        chunk, out = src.tensor, dst.tensor
        if chunk is None or out is None:
            raise ValueError("gaac serde: source and destination must be tensor memory objects")
        chunk_shape([chunk.shape], [chunk.dtype], self.head_dim or chunk.shape[3])
        codec = self.codec(chunk)
        return self._run(chunk, lambda stream: codec.encode(chunk, out.view(-1), object_key(key), stream))

    def deserialize(self, src, dst, key) -> None:
        data, chunk = src.tensor, dst.tensor
        if data is None or chunk is None:
            raise ValueError("gaac serde: source and destination must be tensor memory objects")
        codec = self.codec()
        self._run(chunk, lambda stream: codec.decode(data.view(-1), chunk, object_key(key), stream))

    def check_chunks(self, objs) -> None:
        """Raises ValueError unless every memory object's layout is a chunk of the codec's geometry (the
        calibration's layers and KV heads), as the codec reads their dense bytes (chunk_data); makes the codec
        first (while learning, from the first object's chunk)."""
        if self._codec is None:
            self.codec(objs[0].tensor)
        for obj in objs:
            layers, _, kv_heads = chunk_shape(obj.get_shapes(), obj.get_dtypes(), self.head_dim)
            if (layers, kv_heads) != self.geometry:
                raise ValueError(f"gaac serde: a chunk of {layers} layers and {kv_heads} KV heads; the calibration has "
                                 f"{self.geometry[0]} and {self.geometry[1]}")

    def serialize_batch(self, chunks, outs, keys) -> list[int]:
        """serialize() of chunks into contiguous uint8 tensors, all in the memory of one GPU, as one batch
        (ChunkCodec.encode_batch); returns the objects' sizes. A chunk is a tensor shaped as LMCache's layout, or
        its dense bytes (1-D uint8) from a memory object check_chunks has checked."""
        for chunk in chunks:
            if chunk.dim() != 1:
                chunk_shape([chunk.shape], [chunk.dtype], self.head_dim or chunk.shape[3])
        codec = self.codec(chunks[0])
        return self._run(chunks[0], lambda stream: codec.encode_batch(
            _capsules(chunks), _capsules(outs), [object_key(k) for k in keys], stream))

    def deserialize_batch(self, objects, chunks, keys) -> None:
        """deserialize() of contiguous uint8 tensors into chunks (as serialize_batch takes them), all in the memory
        of one GPU, as one batch (ChunkCodec.decode_batch)."""
        codec = self.codec()
        self._run(chunks[0], lambda stream: codec.decode_batch(
            _capsules(objects), _capsules(chunks), [object_key(k) for k in keys], stream))

    @staticmethod
    def on_one_gpu(tensors) -> bool:
        """Whether every tensor is in the memory of one and the same GPU (None: a memory object without one)."""
        if not tensors or any(t is None or not t.is_cuda for t in tensors):
            return False
        device = tensors[0].device
        return all(t.device == device for t in tensors)

    @staticmethod
    def _run(chunk, work):
        if chunk.device.type != "cuda":
            return work(0)
        with torch.cuda.device(chunk.device):
            return work(torch.cuda.current_stream(chunk.device).cuda_stream)


class GaacSerializer(Serializer):
    """LMCache Serializer: a chunk to a gaac KV chunk object."""

    def __init__(self, serde: GaacSerde):
        self.serde = serde

    def serialize(self, src, dst, key) -> int:
        return self.serde.serialize(src, dst, key)

    def estimate_serialized_size(self, layout_desc) -> int:
        return self.serde.estimate(layout_desc)


class GaacDeserializer(Deserializer):
    """LMCache Deserializer: a gaac KV chunk object back to the chunk, bit for bit."""

    def __init__(self, serde: GaacSerde):
        self.serde = serde

    def deserialize(self, src, dst, key) -> None:
        self.serde.deserialize(src, dst, key)


class GaacSerdeProcessor(AsyncSerdeProcessor):
    """LMCache's AsyncSerdeProcessor around GaacSerializer / GaacDeserializer, except that a task whose chunks and
    buffers are all in one GPU's memory is coded as one batch there (GaacSerde.serialize_batch): up to 8 chunks
    share each of the codec's launches and the host waits once for them, not once a chunk. Other tasks are LMCache's."""

    def __init__(self, serde: GaacSerde, max_workers: int = 1):
        super().__init__(GaacSerializer(serde), GaacDeserializer(serde), max_workers=max_workers)
        self.serde = serde

    def _run_task(self, task_id, task_type, src_objs, dst_objs, keys):
        # Each memory object's bytes are taken once, by one slice (LMCache builds three views at every .tensor).
        serialize = task_type.name == "SERIALIZE"
        chunk_objs, object_objs = (src_objs, dst_objs) if serialize else (dst_objs, src_objs)
        chunks, objects = [chunk_data(o) for o in chunk_objs], [object_bytes(o) for o in object_objs]
        if not self.serde.on_one_gpu(chunks + objects):
            return super()._run_task(task_id, task_type, src_objs, dst_objs, keys)
        try:
            self.serde.check_chunks(chunk_objs)
            if serialize:
                # The destination's logical size narrowed to the object's, as LMCache's own task does.
                for dst, n in zip(dst_objs, self.serde.serialize_batch(chunks, objects, keys), strict=True):
                    if hasattr(dst, "set_used_size"):
                        dst.set_used_size(n)
            else:
                self.serde.deserialize_batch(objects, chunks, keys)
            success = True
        except Exception:
            logger.exception("gaac serde: %s task %d of %d chunks failed", task_type.name.lower(), task_id, len(src_objs))
            success = False
        with self._lock:
            (self._completed_serialize if serialize else self._completed_deserialize)[task_id] = success
        try:
            (self._serialize_efd if serialize else self._deserialize_efd).notify()
        except OSError:
            logger.exception("gaac serde: the notifier of task %d failed", task_id)


def create_serde(kwargs: dict) -> GaacSerdeProcessor:
    """The factory registered as ``gaac``: a GaacSerdeProcessor around GaacSerializer / GaacDeserializer."""
    unknown = sorted(set(kwargs) - set(_KWARGS))
    if unknown:
        raise ValueError(f"gaac serde: unknown option(s) {unknown}; it takes {list(_KWARGS)}")
    options = {k: kwargs[k] for k in _KWARGS[:-1] if k in kwargs}
    serde = GaacSerde(**options)
    return GaacSerdeProcessor(serde, max_workers=int(kwargs.get("max_workers", 1)))


if SERDE_TYPE not in get_registered_serde_types():
    register_serde_factory(SERDE_TYPE, create_serde)


if __name__ == "__main__":  # python -m gaac.lmcache <lmcache command line>: LMCache's CLI with the serde registered
    from lmcache.cli.main import main

    sys.exit(main())
