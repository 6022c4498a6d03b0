#!/usr/bin/env python3
"""LMCache serdes on the same KV chunks, in one process: gaac (gaac.lmcache) beside LMCache's own (none, fp8) and,
on a GPU, nvCOMP ANS where its Python package is installed; then the end-to-end figure: seconds to store the KV
of a long prompt through LMCache's file-system L2 adapter and to load it back, with and without gaac.

Chunks of 256 tokens, [2, layers, 256, kv_heads * head_dim] bfloat16, as LMCache holds them:
  smollm2, gemma3   the real caches scripts/bench_kv.sh writes (2,048 tokens of GPL-3 each: 8 chunks) with their
                    calibration tables (learnt on another text), from --kv-dir
  8b                the 8B geometry (32 layers, 8 KV heads of 128; 32 query heads) with real statistics: SmolLM2's
                    64-wide heads side by side, (layer, head) pairs taken in turn, tokens cycled over its 2,048
                    (bench/gpu/bench_codecs.py's pairing); its calibration is SmolLM2's table rearranged the same way
For each serde and chunk set: ratio (BF16 bytes / bytes stored), serialize and deserialize GB/s (of BF16), on
the CPU with 1 and 4 threads (gaac's per-chunk threads, PyTorch's intra-op threads for fp8), and with --device cuda
on the GPU, where gaac.ChunkCodec is also timed called directly (no LMCache objects, no wrapper: "gaac-codec" one
call a chunk, "gaac-batch" one encode_batch / decode_batch call of all the chunks), and where LMCache's wrapper hands
gaac's processor one task of all the chunks ("gaac-task"), and --tasks-in-flight such tasks at once on each of
--task-workers workers ("gaac-tasks-4x2": 4 tasks, 2 workers). gaac's ratio is given for objects of their own size and
for the fixed size LMCache's adapters need (object_ratio 1.38). Every lossless result is checked bit for bit before
it is timed; fp8 is lossy (its error is reported). Times are the best of --repeats passes over all chunks of a set (serialize, then deserialize).

End to end (--e2e-tokens, default 32,768: 128 chunks of the 8B geometry, 4 GiB of BF16): the chunks are put in
LMCache's L1 manager and stored through its FSL2Adapter (one store task per 8 chunks, all submitted at once),
then loaded back into fresh L1 buffers; with gaac the adapter is wrapped by SerdeL2AdapterWrapper (the serde
built from the JSON a user configures). --e2e-io says how the adapter's files are read and written: "page" through
the page cache, "odirect" bypassing it (O_DIRECT); a list runs each. --e2e-serde lists gaac's configurations as
WORKERSxTHREADS (LMCache's serde workers, each coding a chunk with that many threads). "none" runs once per --e2e-io.
Every chunk loaded is checked bit for bit.

  python3 bench/lmcache_serde.py --kv-dir ~/.cache/gaac/kv --out results.json [--device cuda] [--e2e-tokens 32768]
      [--e2e-dir /path/on/the/disk] [--e2e-io page,odirect] [--e2e-serde 2x4,4x4] [--repeats 3]
      [--skip-e2e | --skip-serdes] [--profile-serde] [--threads 1,4 | --threads ""]
      [--tasks-in-flight 4] [--task-workers 1,2]
"""
import argparse
import json
import os
import platform
import sys
import tempfile
import time
import types

import numpy as np
import torch

import gaac

CHUNK = 256


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---- chunks ------------------------------------------------------------------------------------------

def load_dump(path):
    k, v = gaac.load_kv_dump(path)
    return torch.stack([torch.stack([gaac.to_torch(x).reshape(x.shape[0], -1) for x in layers]) for layers in (k, v)])


def real_set(kv_dir, model):
    full = load_dump(os.path.join(kv_dir, f"{model}-gpl3-2048.safetensors"))
    chunks = [full[:, :, s:s + CHUNK].contiguous() for s in range(0, full.shape[2] - CHUNK + 1, CHUNK)]
    return chunks, gaac.Calibration.load(os.path.join(kv_dir, f"{model}-calibration.safetensors"))


class RealStatistics8B:
    """The 8B geometry from SmolLM2's KV: head h of 8B layer l = SmolLM2 (layer, head) pieces 16l + 2h and
    16l + 2h + 1 (modulo its 90) side by side; token t of chunk c = its token (256c + t) mod 2048."""

    LAYERS, HEADS, WIDTH = 32, 8, 128

    def __init__(self, kv_dir):
        self.src = load_dump(os.path.join(kv_dir, "smollm2-gpl3-2048.safetensors"))  # [2, 30, 2048, 192]
        self.tokens = self.src.shape[2]
        layers, heads = self.src.shape[1], self.src.shape[3] // 64
        self.pieces = [divmod((16 * l + 2 * h + part) % (layers * heads), heads)
                       for l in range(self.LAYERS) for h in range(self.HEADS) for part in range(2)]
        # One period of the token cycle, rearranged once: [2, 32, 2048, 1024].
        self.period = torch.empty((2, self.LAYERS, self.tokens, self.HEADS * self.WIDTH), dtype=torch.bfloat16)
        for i, (sl, sh) in enumerate(self.pieces):
            l, rest = divmod(i, 2 * self.HEADS)
            h, part = divmod(rest, 2)
            self.period[:, l, :, h * 128 + part * 64:h * 128 + part * 64 + 64] = self.src[:, sl, :, sh * 64:sh * 64 + 64]
        self.calibration = self._calibration(kv_dir)

    def chunk(self, c, out=None):
        start = (c * CHUNK) % self.tokens
        piece = self.period[:, :, start:start + CHUNK]
        if out is None:
            return piece.contiguous()
        out.copy_(piece)
        return out

    def _calibration(self, kv_dir):
        from safetensors import safe_open
        from safetensors.numpy import save_file

        with safe_open(os.path.join(kv_dir, "smollm2-calibration.safetensors"), "np") as f:
            meta, tables = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
        out = {}
        for name, src in tables.items():  # [30, 3, 64] → [32, 8, 128]
            dst = np.empty((self.LAYERS, self.HEADS, self.WIDTH), dtype=np.uint8)
            for i, (sl, sh) in enumerate(self.pieces):
                l, rest = divmod(i, 2 * self.HEADS)
                h, part = divmod(rest, 2)
                dst[l, h, part * 64:part * 64 + 64] = src[sl, sh]
            out[name] = dst
        capacities = json.dumps([64] * self.LAYERS)
        metadata = {"format": meta["format"], "format_version": meta["format_version"],
                    "tile_format_version": meta["tile_format_version"], "layers": str(self.LAYERS),
                    "kv_heads": str(self.HEADS), "head_dim": str(self.WIDTH), "k.escape_capacity": capacities,
                    "v.escape_capacity": capacities, "info.source": "smollm2 table, heads paired as the 8B chunks"}
        path = os.path.join(tempfile.mkdtemp(prefix="gaac-bench-"), "8b-calibration.safetensors")
        save_file(out, path, metadata=metadata)
        return gaac.Calibration.load(path)


# ---- serdes ------------------------------------------------------------------------------------------

def memory_obj(tensor):
    """LMCache's TensorMemoryObj over a tensor (any device), as its L1 manager hands serdes."""
    from lmcache.v1.memory_management import MemoryObjMetadata, TensorMemoryObj

    raw = tensor.reshape(-1).view(torch.uint8)
    meta = MemoryObjMetadata(shape=tensor.shape, dtype=tensor.dtype, address=0, phy_size=raw.numel(), ref_count=1,
                             shapes=[tensor.shape], dtypes=[tensor.dtype])
    return TensorMemoryObj(raw, meta, None)


def key_of(i):
    from lmcache.v1.distributed.api import ObjectKey

    return ObjectKey(chunk_hash=i.to_bytes(8, "little"), model_name="bench", kv_rank=0)


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def serde_objects(serializer, chunks, device):
    """The chunks on `device` and LMCache's memory objects a serde pass reads and writes: (chunks, sources,
    objects sized by the serializer's estimate, chunks to decode into, their memory objects, keys)."""
    from lmcache.v1.distributed.api import MemoryLayoutDesc

    chunks = [c.to(device) for c in chunks]
    size = serializer.estimate_serialized_size(MemoryLayoutDesc(shapes=[chunks[0].shape], dtypes=[chunks[0].dtype]))
    srcs = [memory_obj(c) for c in chunks]
    dsts = [memory_obj(torch.zeros(size, dtype=torch.uint8, device=device)) for _ in chunks]
    backs = [torch.zeros_like(c) for c in chunks]
    return chunks, srcs, dsts, backs, [memory_obj(b) for b in backs], [key_of(i) for i in range(len(chunks))]


def time_serde(name, serializer, deserializer, chunks, device, repeats, lossless):
    """Ratio, serialize and deserialize GB/s of a Serializer / Deserializer pair over the chunks."""
    chunks, srcs, dsts, backs, outs, keys = serde_objects(serializer, chunks, device)
    written = [serializer.serialize(s, d, k) for s, d, k in zip(srcs, dsts, keys)]
    for d, o, k in zip(dsts, outs, keys):
        deserializer.deserialize(d, o, k)
    sync(device)
    if lossless:
        bad = [i for i, (b, c) in enumerate(zip(backs, chunks)) if not torch.equal(b.view(torch.int16), c.view(torch.int16))]
        if bad:
            raise RuntimeError(f"{name}: chunks {bad} did not come back bit for bit")
        error = 0.0
    else:
        error = max(float((b.float() - c.float()).abs().max()) for b, c in zip(backs, chunks))
    best_s = best_d = float("inf")
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        for s, d, k in zip(srcs, dsts, keys):
            serializer.serialize(s, d, k)
        sync(device)
        t1 = time.perf_counter()
        for d, o, k in zip(dsts, outs, keys):
            deserializer.deserialize(d, o, k)
        sync(device)
        t2 = time.perf_counter()
        best_s, best_d = min(best_s, t1 - t0), min(best_d, t2 - t1)
    bf16 = sum(c.numel() * 2 for c in chunks)
    return {"serde": name, "device": device, "ratio": bf16 / sum(written), "stored_bytes": sum(written),
            "bf16_bytes": bf16, "chunk_shape": list(chunks[0].shape), "serialize_gbps": bf16 / best_s / 1e9, "deserialize_gbps": bf16 / best_d / 1e9,
            "max_abs_error": error}


def time_tasks(name, processor, chunks, device, repeats, profile_kernels=False, waiter="fd", in_flight=1):
    """Ratio, serialize and deserialize GB/s of a SerdeProcessor given all the chunks as one task each way, as
    LMCache's serde wrapper hands it a store or load task (submit, then wait for the result); with `in_flight` > 1,
    that many such tasks (each with buffers of its own) submitted at once and waited for together, as LMCache's
    store of a long prompt submits its tasks. The waiter is LMCache's by default ("fd": block in poll() on the
    processor's event fd, then take the results, as SerdeL2AdapterWrapper's loop does); "sleep" asks for the
    results every 20 µs and sleeps in between, which keeps taking the GIL back from the processor's workers. With
    `profile_kernels` (CUDA, one task in flight), also where a task's time goes (serialize_stamps_us,
    deserialize_stamps_us: task_stamps; serialize_call_us, deserialize_call_us: call_phases)."""
    import select

    from lmcache.v1.distributed.api import MemoryLayoutDesc
    from lmcache.v1.platform.event_notifier import consume_fd

    size = processor.estimate_serialized_size(MemoryLayoutDesc(shapes=[chunks[0].shape], dtypes=[chunks[0].dtype]))
    chunks = [c.to(device) for c in chunks]
    srcs = [memory_obj(c) for c in chunks]
    flights = range(in_flight)
    buffers = [[torch.zeros(size, dtype=torch.uint8, device=device) for _ in chunks] for _ in flights]
    dsts = [[] for _ in flights]
    backs = [[torch.zeros_like(c) for c in chunks] for _ in flights]
    outs = [[memory_obj(b) for b in flight] for flight in backs]
    keys = [key_of(i) for i in range(len(chunks))]

    def run(submit, query, fd, pairs):
        pending = [submit(a, b, keys) for a, b in pairs]
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while True:
            results = [query(task) for task in pending]
            if any(ok is False for ok in results):
                raise RuntimeError(f"{name}: a task failed")
            pending = [task for task, ok in zip(pending, results) if ok is None]
            if not pending:
                return
            if waiter == "fd":
                poller.poll(1000)
                consume_fd(fd)
            else:
                time.sleep(0.00002)

    def serialize():
        # Fresh objects over the same buffers, as LMCache's allocator hands them (a serialize narrows its object).
        for flight, bufs in zip(dsts, buffers):
            flight[:] = [memory_obj(b) for b in bufs]
        run(processor.submit_serialize, processor.query_serialize_result, processor.get_serialize_event_fd(),
            [(srcs, flight) for flight in dsts])

    def deserialize():
        run(processor.submit_deserialize, processor.query_deserialize_result, processor.get_deserialize_event_fd(),
            list(zip(dsts, outs)))

    serialize()
    deserialize()
    sync(device)
    if any(not torch.equal(b.view(torch.int16), c.view(torch.int16)) for flight in backs for b, c in zip(flight, chunks)):
        raise RuntimeError(f"{name}: a chunk did not come back bit for bit")
    stored = sum(d.get_size() for d in dsts[0])
    best_s = best_d = float("inf")
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        serialize()
        sync(device)
        t1 = time.perf_counter()
        deserialize()
        sync(device)
        t2 = time.perf_counter()
        best_s, best_d = min(best_s, t1 - t0), min(best_d, t2 - t1)
    bf16 = sum(c.numel() * 2 for c in chunks)
    result = {"serde": name, "device": device, "ratio": bf16 / stored, "stored_bytes": stored, "bf16_bytes": bf16,
              "chunk_shape": list(chunks[0].shape), "tasks_in_flight": in_flight,
              "serialize_gbps": in_flight * bf16 / best_s / 1e9, "deserialize_gbps": in_flight * bf16 / best_d / 1e9,
              "max_abs_error": 0.0}
    if profile_kernels and in_flight > 1:
        raise ValueError("time_tasks: profile_kernels with one task in flight only")
    if profile_kernels:
        for what, task in (("serialize", serialize), ("deserialize", deserialize)):
            result[f"{what}_stamps_us"] = stamps = task_stamps(processor, task)
            log(f"{name} {what}: a task by time stamps (no profiler), median µs: " +
                ", ".join(f"{k} {v:.1f}" for k, v in stamps.items()))
        passes = 5
        for what, task in (("serialize", serialize), ("deserialize", deserialize)):
            def tasks():
                for _ in range(passes):
                    task()
                sync(device)
            _, phases = kernel_times(tasks, passes * len(chunks))
            result[f"{what}_call_us"] = phases
            log(f"{name} {what}: a task, µs: " + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()))
    return result


def task_stamps(processor, task, passes=30):
    """Where a GaacSerdeProcessor task's wall time goes, from time stamps taken in the main thread and in the
    processor's worker (no profiler, whose per-op cost would swamp the Python it measures): median µs over
    `passes` runs of `task()` of each step from the submit to the main thread's return with the result.
    Steps: make objects (the benchmark's fresh destination objects), submit, hand-off (to the worker's start),
    tensors (each object's bytes or .tensor), check (on one GPU), prepare (the chunks' checks, the codec, the device and
    stream, capsules and keys), binding (gaac's call: arguments, launches, the GPU's work and the wait), finish
    (sizes, the result), wake (the notify to the main thread's last query) and result."""
    serde = processor.serde
    marks = {}

    def mark(step):
        marks[step] = time.perf_counter()

    def binding(call):
        def stamped(*a):
            mark("prepared")
            try:
                return call(*a)
            finally:
                mark("bound")
        return stamped

    def run_task(*a):
        mark("started")
        return type(processor)._run_task(processor, *a)

    class StampedNotifier:
        def __init__(self, notifier):
            self.notifier = notifier

        def notify(self):
            mark("finished")
            return self.notifier.notify()

        def __getattr__(self, attr):
            return getattr(self.notifier, attr)

    def on_one_gpu(tensors):
        mark("tensors")
        try:
            return type(serde).on_one_gpu(tensors)
        finally:
            mark("checked")

    submits = {}
    for attr in ("submit_serialize", "submit_deserialize"):
        def submit(*a, _submit=getattr(processor, attr)):
            mark("submitting")
            try:
                return _submit(*a)
            finally:
                mark("submitted")
        submits[attr] = submit
    query = {attr: getattr(processor, attr) for attr in ("query_serialize_result", "query_deserialize_result")}

    def queried(attr):
        def q(task_id):
            mark("woken")
            return query[attr](task_id)
        return q

    codec, notifiers = serde.codec(), (processor._serialize_efd, processor._deserialize_efd)
    stamped_codec = types.SimpleNamespace(encode_batch=binding(codec.encode_batch), decode_batch=binding(codec.decode_batch))
    serde._codec, processor._run_task, serde.on_one_gpu = stamped_codec, run_task, on_one_gpu
    processor._serialize_efd, processor._deserialize_efd = (StampedNotifier(n) for n in notifiers)
    for attr, f in submits.items():
        setattr(processor, attr, f)
    for attr in query:
        setattr(processor, attr, queried(attr))
    steps = ("submitting", "submitted", "started", "tensors", "checked", "prepared", "bound", "finished", "woken")
    names = ("make objects", "submit", "hand-off", "tensors", "check", "prepare", "binding", "finish", "wake", "result")
    rows = []
    try:
        for _ in range(passes):
            marks.clear()
            start = time.perf_counter()
            task()
            end = time.perf_counter()
            if not all(s in marks for s in steps):
                raise RuntimeError("task_stamps: the task did not go through GaacSerdeProcessor's batch path")
            times = [start] + [marks[s] for s in steps] + [end]
            rows.append([(b - a) * 1e6 for a, b in zip(times, times[1:])] + [(end - start) * 1e6])
    finally:
        serde._codec = codec
        processor._serialize_efd, processor._deserialize_efd = notifiers
        for attr in ("_run_task", "on_one_gpu", *submits, *query):
            for o in (processor, serde):
                o.__dict__.pop(attr, None)
    return {n: float(np.median([r[i] for r in rows])) for i, n in enumerate((*names, "task"))}


def profile_serde(name, serializer, deserializer, chunks, passes=20):
    """The host time of gaac's serde on CUDA chunks by function (cProfile over `passes` passes of serialize
    then deserialize), logged: what the serde adds to gaac.ChunkCodec's own call."""
    import cProfile
    import io
    import pstats

    chunks, srcs, dsts, _, outs, keys = serde_objects(serializer, chunks, "cuda")
    calls = passes * len(chunks)
    profile = cProfile.Profile()
    torch.cuda.synchronize()
    profile.enable()
    for _ in range(passes):
        for s, d, o, k in zip(srcs, dsts, outs, keys):
            serializer.serialize(s, d, k)
            deserializer.deserialize(d, o, k)
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(12)
    log(f"{name}: gaac serde on CUDA, {calls} serialize + deserialize pairs (per pair: divide by {calls})")
    log("\n".join(line for line in text.getvalue().splitlines() if line.strip()))


def gaac_pair(calibration, threads, object_ratio):
    import gaac.lmcache as gl

    path = os.path.join(tempfile.mkdtemp(prefix="gaac-bench-"), "calibration.safetensors")
    calibration.save(path)
    serde = gl.GaacSerde(path, threads=threads, object_ratio=object_ratio)
    return gl.GaacSerializer(serde), gl.GaacDeserializer(serde)


def fp8_pair():
    from lmcache.v1.distributed.serde.fp8 import Fp8QuantizationDeserializer, Fp8QuantizationSerializer

    return Fp8QuantizationSerializer(), Fp8QuantizationDeserializer()


def kernel_times(run, calls):
    """The GPU's work in `run()` (which makes `calls` codec calls), by kernel and copy: [(name, µs a call)]
    from PyTorch's profiler (CUPTI sees every kernel of the process, gaac's among them), costliest first;
    and where each call's wall time goes (call_phases)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
    path = os.path.join(tempfile.mkdtemp(prefix="gaac-trace-"), "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f).get("traceEvents", [])
    totals = {}
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            name = e["name"].replace("(anonymous namespace)::", "").split("(")[0].split("<")[0].split("::")[-1]
            totals[name] = totals.get(name, 0.0) + float(e.get("dur", 0.0))
    return sorted(((n, t / calls) for n, t in totals.items()), key=lambda r: -r[1]), call_phases(events)


def call_phases(events):
    """Where a codec call's wall time goes, from a profiler trace of back-to-back calls that each end in a
    cudaStreamSynchronize: µs a call (mean over all but the first) of host work before its first launch (the
    bindings, the arguments, the workspaces), of enqueueing (first launch to the start of the wait), of the
    GPU idle while the call runs (from its first launch to the wait's end, minus the GPU's busy time), of the
    GPU's busy time, and the whole call (one wait's end to the next's)."""
    runtime = sorted((e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")), key=lambda e: e["ts"])
    gpu = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    waits = [e for e in runtime if e["name"] == "cudaStreamSynchronize"]
    phases = []
    for before, wait in zip(waits, waits[1:]):
        start, end = before["ts"] + before["dur"], wait["ts"] + wait["dur"]
        launches = [e for e in runtime if start <= e["ts"] < wait["ts"] and e["name"] != "cudaStreamSynchronize"]
        first = next((e["ts"] for e in launches if "Launch" in e["name"]), None)
        if first is None:
            continue
        busy = sum(min(e["ts"] + e["dur"], end) - max(e["ts"], first) for e in gpu if e["ts"] < end and e["ts"] + e["dur"] > first)
        phases.append({"host_before_launch": first - start, "enqueue": wait["ts"] - first,
                       "gpu_idle": (end - first) - busy, "gpu_busy": busy, "call": end - start})
    if not phases:
        return {}
    return {k: sum(p[k] for p in phases) / len(phases) for k in phases[0]}


def time_codec(calibration, chunks, repeats, profile_kernels=False, batch=False, capsules=False):
    """gaac.ChunkCodec called directly on CUDA chunks (no LMCache memory objects, no serde wrapper), timed as
    time_serde times a serde: what the binding and the codec take, apart from the wrapper's Python. One call a
    chunk ("gaac-codec"), or with `batch` all the chunks in one encode_batch / decode_batch call each way
    ("gaac-batch"); with `capsules`, the batch's arrays handed over as DLPack capsules made by
    torch.utils.dlpack.to_dlpack ("gaac-batch-capsules") rather than as tensors (whose __dlpack__ the binding
    calls). With `profile_kernels`, also the GPU time of each of its kernels a chunk (encode_kernels_us,
    decode_kernels_us)."""
    codec = gaac.ChunkCodec(calibration)
    chunks = [c.cuda() for c in chunks]
    outs = [torch.zeros(codec.object_bytes(c.shape[2]), dtype=torch.uint8, device="cuda") for c in chunks]
    backs = [torch.zeros_like(c) for c in chunks]
    keys = [f"bench@{i}" for i in range(len(chunks))]
    stream = torch.cuda.current_stream().cuda_stream
    label = ("gaac-batch-capsules" if capsules else "gaac-batch") if batch else "gaac-codec"
    arrays = (lambda ts: [torch.utils.dlpack.to_dlpack(t) for t in ts]) if capsules else (lambda ts: ts)

    def encode_all():
        if batch:
            return codec.encode_batch(arrays(chunks), arrays(outs), keys, stream)
        return [codec.encode(c, o, k, stream) for c, o, k in zip(chunks, outs, keys)]

    def decode_all():
        if batch:
            codec.decode_batch(arrays(outs), arrays(backs), keys, stream)
        else:
            for o, b, k in zip(outs, backs, keys):
                codec.decode(o, b, k, stream)

    written = encode_all()
    decode_all()
    torch.cuda.synchronize()
    if any(not torch.equal(b.view(torch.int16), c.view(torch.int16)) for b, c in zip(backs, chunks)):
        raise RuntimeError(f"{label}: a chunk did not come back bit for bit")
    best_s = best_d = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        encode_all()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        decode_all()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        best_s, best_d = min(best_s, t1 - t0), min(best_d, t2 - t1)
    bf16 = sum(c.numel() * 2 for c in chunks)
    result = {"serde": label, "device": "cuda", "ratio": bf16 / sum(written), "stored_bytes": sum(written),
              "bf16_bytes": bf16, "chunk_shape": list(chunks[0].shape), "serialize_gbps": bf16 / best_s / 1e9,
              "deserialize_gbps": bf16 / best_d / 1e9, "max_abs_error": 0.0}
    if profile_kernels:
        passes = 5
        calls = passes * len(chunks)

        def encodes():
            for _ in range(passes):
                encode_all()
            torch.cuda.synchronize()

        def decodes():
            for _ in range(passes):
                decode_all()
            torch.cuda.synchronize()

        n = 1000
        t0 = time.perf_counter()
        for _ in range(n):
            chunks[0].__dlpack__()
        result["dlpack_us"] = (time.perf_counter() - t0) / n * 1e6
        log(f"{label}: a CUDA tensor's __dlpack__() (what the binding calls for each array) takes {result['dlpack_us']:.1f} µs")
        for what, run in (("encode", encodes), ("decode", decodes)):
            times, phases = kernel_times(run, calls)
            result[f"{what}_kernels_us"] = dict(times)
            result[f"{what}_call_us"] = phases
            log(f"{label} {what}: {sum(t for _, t in times):.1f} µs of GPU work a chunk: "
                + ", ".join(f"{n} {t:.1f}" for n, t in times))
            log(f"{label} {what}: a call, µs: " + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()))
    return result


def time_nvcomp(chunks, repeats):
    """nvCOMP's ANS (what FlexKV uses) on the GPU through its Python package, on the chunks' bytes as float16
    words; None when the package is missing."""
    try:
        from nvidia import nvcomp
    except ImportError:
        return None
    stream = torch.cuda.current_stream().cuda_stream
    codec = nvcomp.Codec(algorithm="ANS", data_type="<f2", cuda_stream=stream)
    arrays = [nvcomp.as_array(c.cuda().reshape(-1).view(torch.float16), stream) for c in chunks]
    encoded = [codec.encode(a) for a in arrays]
    decoded = [codec.decode(e) for e in encoded]
    torch.cuda.synchronize()
    for d, c in zip(decoded, chunks):
        if not torch.equal(torch.from_dlpack(d).view(torch.int16).reshape(-1).cpu(), c.view(torch.int16).reshape(-1)):
            raise RuntimeError("nvCOMP ANS: a chunk did not come back bit for bit")
    best_s = best_d = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        encoded = [codec.encode(a) for a in arrays]
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        decoded = [codec.decode(e) for e in encoded]
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        best_s, best_d = min(best_s, t1 - t0), min(best_d, t2 - t1)
    bf16 = sum(c.numel() * 2 for c in chunks)
    stored = sum(int(e.buffer_size) if hasattr(e, "buffer_size") else torch.from_dlpack(e).numel() for e in encoded)
    return {"serde": "nvcomp-ans", "device": "cuda", "ratio": bf16 / stored, "stored_bytes": stored, "bf16_bytes": bf16,
            "serialize_gbps": bf16 / best_s / 1e9, "deserialize_gbps": bf16 / best_d / 1e9, "max_abs_error": 0.0}


# ---- end to end --------------------------------------------------------------------------------------

def e2e(source, tokens, directory, serde, odirect, batch=8):
    """Seconds to store `tokens` tokens of 8B chunks through the fs adapter (wrapped with gaac's serde when `serde`,
    (workers, threads), is given) and to load them back; every chunk checked."""
    import argparse as ap

    from lmcache.v1.distributed.api import MemoryLayoutDesc
    from lmcache.v1.distributed.config import L1ManagerConfig, L1MemoryManagerConfig
    from lmcache.v1.distributed.l1_manager import L1Manager
    from lmcache.v1.distributed.l2_adapters import create_l2_adapter
    from lmcache.v1.distributed.l2_adapters.config import add_l2_adapters_args, parse_args_to_l2_adapters_config
    from lmcache.v1.distributed.l2_adapters.serde_wrapper import SerdeL2AdapterWrapper
    from lmcache.v1.distributed.serde import create_serde_processor

    import gaac.lmcache  # noqa: F401  (registers the serde)

    n = tokens // CHUNK
    shape = torch.Size([2, source.LAYERS, CHUNK, source.HEADS * source.WIDTH])
    chunk_bytes = shape.numel() * 2
    spec = {"type": "fs", "base_path": directory, "use_odirect": bool(odirect)}
    use_gaac = serde is not None
    if use_gaac:
        path = os.path.join(directory, "8b-calibration.safetensors")
        source.calibration.save(path)
        spec["serde"] = {"type": "gaac", "calibration": path, "max_workers": serde[0], "threads": serde[1]}
    parser = ap.ArgumentParser()
    add_l2_adapters_args(parser)
    config = parse_args_to_l2_adapters_config(parser.parse_args(["--l2-adapter", json.dumps(spec)])).adapters[0]
    # Room for the chunks and, all tasks being in flight at once, the serde's buffer of each.
    l1 = L1Manager(L1ManagerConfig(memory_config=L1MemoryManagerConfig(
        size_in_bytes=2 * n * chunk_bytes + (1 << 30), use_lazy=False, shm_name="")))
    adapter = create_l2_adapter(config, l1.get_l1_memory_desc())
    if use_gaac:
        adapter = SerdeL2AdapterWrapper(inner=adapter, serde=create_serde_processor(config.serde_config), l1_manager=l1)
    layout = MemoryLayoutDesc(shapes=[shape], dtypes=[torch.bfloat16])
    keys = [key_of(i) for i in range(n)]
    try:
        objs = []
        for i, k in enumerate(keys):
            obj = l1.reserve_write([k], [False], layout)[k][1]
            source.chunk(i, obj.tensor)
            objs.append(obj)
        l1.finish_write(keys)
        l1.reserve_read(keys)
        t0 = time.perf_counter()
        tasks = {adapter.submit_store_task(keys[i:i + batch], objs[i:i + batch]) for i in range(0, n, batch)}
        failed = 0
        while tasks:
            for task, result in adapter.pop_completed_store_tasks().items():
                tasks.discard(task)
                failed += not result.is_successful()
            time.sleep(0.0005)
        store_s = time.perf_counter() - t0
        if failed:
            raise RuntimeError(f"{failed} store tasks failed")
        l1.finish_read(keys)
        l1.delete(keys)
        on_disk = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory) if f.endswith(".data"))
        load_keys = [key_of(n + i) for i in range(n)]
        bufs = [l1.reserve_write([k], [False], layout)[k][1] for k in load_keys]
        t0 = time.perf_counter()
        pending = {adapter.submit_load_task(keys[i:i + batch], bufs[i:i + batch]): i for i in range(0, n, batch)}
        loaded = 0
        while pending:
            for task in list(pending):
                bitmap = adapter.query_load_result(task)
                if bitmap is not None:
                    loaded += len(bitmap.get_indices_list())
                    del pending[task]
            time.sleep(0.0005)
        load_s = time.perf_counter() - t0
        if loaded != n:
            raise RuntimeError(f"{n - loaded} chunks were not loaded")
        scratch = torch.empty(shape, dtype=torch.bfloat16)
        for i, b in enumerate(bufs):
            if not torch.equal(b.tensor.view(torch.int16), source.chunk(i, scratch).view(torch.int16)):
                raise RuntimeError(f"chunk {i} did not come back bit for bit")
        return {"serde": "gaac" if use_gaac else "none", "tokens": tokens, "chunks": n, "bf16_bytes": n * chunk_bytes,
                "bytes_on_disk": on_disk, "store_s": store_s, "load_s": load_s, "odirect": bool(odirect),
                "workers": serde[0] if use_gaac else None, "threads": serde[1] if use_gaac else None}
    finally:
        adapter.close()
        l1.close()


# ---- main --------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kv-dir", default=os.environ.get("GAAC_KV_DIR", os.path.expanduser("~/.cache/gaac/kv")))
    ap.add_argument("--out", required=True, help="JSON results")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: the GPU figures too")
    ap.add_argument("--threads", default="1,4", help="CPU thread counts; \"\" for none (with --device cuda: the GPU alone)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--e2e-tokens", type=int, default=32768)
    ap.add_argument("--e2e-serde", default="2x4", help="gaac's configurations, WORKERSxTHREADS, comma-separated")
    ap.add_argument("--e2e-dir", default=None, help="directory for the fs adapter's files (default: a temporary one)")
    ap.add_argument("--e2e-io", default="page", help="page (through the page cache), odirect (O_DIRECT), or both")
    ap.add_argument("--skip-e2e", action="store_true")
    ap.add_argument("--skip-serdes", action="store_true", help="the end-to-end figure alone")
    ap.add_argument("--tasks-in-flight", type=int, default=4,
                    help="with --device cuda: also this many tasks of all the chunks submitted at once (< 2: not)")
    ap.add_argument("--task-workers", default="1,2", help="the processor's workers for the tasks in flight")
    ap.add_argument("--profile-serde", action="store_true",
                    help="with --device cuda: where gaac's serde spends a call's host time (cProfile, the 12 costliest) "
                         "and gaac.ChunkCodec its GPU time (each kernel's µs a call)")
    args = ap.parse_args()
    if args.repeats < 1 or args.e2e_tokens < CHUNK or args.e2e_tokens % CHUNK:
        ap.error("--repeats ≥ 1 and --e2e-tokens a positive multiple of 256")
    if not 0 <= args.tasks_in_flight <= 64:
        ap.error("--tasks-in-flight: 0 to 64 (each task holds its chunks' objects)")
    try:
        threads = [int(t) for t in args.threads.split(",") if t]
        task_workers = [int(w) for w in args.task_workers.split(",") if w]
    except ValueError:
        threads = task_workers = [0]
    if any(not 1 <= n <= 256 for n in threads + task_workers):
        ap.error("--threads and --task-workers: comma-separated counts from 1 to 256")
    try:
        serde_configs = [tuple(int(n) for n in c.split("x")) for c in args.e2e_serde.split(",")]
    except ValueError:
        serde_configs = []
    if not serde_configs or any(len(c) != 2 or min(c) < 1 for c in serde_configs):
        ap.error("--e2e-serde: WORKERSxTHREADS[,...], e.g. 2x4")
    io_modes = args.e2e_io.split(",")
    if not io_modes or any(m not in ("page", "odirect") for m in io_modes):
        ap.error("--e2e-io: page, odirect, or both")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device")

    results = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
                           "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None},
               "command": " ".join(sys.argv), "serdes": [], "e2e": []}
    eight_b = RealStatistics8B(args.kv_dir)
    sets = {name: real_set(args.kv_dir, name) for name in ("smollm2", "gemma3")}
    sets["8b"] = ([eight_b.chunk(c) for c in range(8)], eight_b.calibration)

    for name, (chunks, calibration) in ([] if args.skip_serdes else sets.items()):
        # The shape says which cut of a model's cache was read (a --kv-dir may hold one-layer cuts).
        log(f"{name}: {len(chunks)} chunks of {list(chunks[0].shape)} ({chunks[0].numel() * 2} bytes of BF16 each)")
        for t in threads:
            torch.set_num_threads(t)
            runs = [("gaac", *gaac_pair(calibration, t, 0), True),
                    ("gaac-fixed-1.38", *gaac_pair(calibration, t, 1.38), True),
                    ("fp8", *fp8_pair(), False)]
            for label, ser, de, lossless in runs:
                r = time_serde(label, ser, de, chunks, "cpu", args.repeats, lossless)
                r.update(chunks=name, threads=t)
                results["serdes"].append(r)
                log(f"{name:8s} {label:16s} cpu x{t}: ratio {r['ratio']:.4f}  serialize {r['serialize_gbps']:.2f} GB/s  "
                    f"deserialize {r['deserialize_gbps']:.2f} GB/s")
        results["serdes"].append({"serde": "none", "chunks": name, "ratio": 1.0, "device": "cpu",
                                  "bf16_bytes": sum(c.numel() * 2 for c in chunks)})
        if args.device == "cuda":
            runs = [("gaac", *gaac_pair(calibration, 1, 0), True), ("fp8", *fp8_pair(), False)]
            for label, ser, de, lossless in runs:
                r = time_serde(label, ser, de, chunks, "cuda", args.repeats, lossless)
                r.update(chunks=name)
                results["serdes"].append(r)
                log(f"{name:8s} {label:16s} cuda: ratio {r['ratio']:.4f}  serialize {r['serialize_gbps']:.1f} GB/s  "
                    f"deserialize {r['deserialize_gbps']:.1f} GB/s")
            # One task of all the chunks each way, as LMCache's wrapper hands the serde a store or load.
            path = os.path.join(tempfile.mkdtemp(prefix="gaac-bench-"), "calibration.safetensors")
            calibration.save(path)
            from gaac.lmcache import create_serde

            # With --profile-serde, the same tasks again under a waiter that polls with sleeps: what it costs.
            for label, waiter in [("gaac-task", "fd")] + ([("gaac-task-sleep", "sleep")] if args.profile_serde else []):
                processor = create_serde({"calibration": path, "object_ratio": 0})
                try:
                    r = time_tasks(label, processor, chunks, "cuda", args.repeats, args.profile_serde, waiter)
                finally:
                    processor.close()
                r.update(chunks=name, waiter=waiter)
                results["serdes"].append(r)
                log(f"{name:8s} {label:16s} cuda: ratio {r['ratio']:.4f}  serialize {r['serialize_gbps']:.1f} GB/s  "
                    f"deserialize {r['deserialize_gbps']:.1f} GB/s  ({len(chunks)} chunks a task, as LMCache's wrapper "
                    f"hands them; waiter: {waiter})")
            # Several tasks in flight at once, as a long prompt's store submits them, on 1 or more workers: a
            # task's host work may then overlap another's GPU work.
            for workers in ([] if args.tasks_in_flight < 2 else task_workers):
                label = f"gaac-tasks-{args.tasks_in_flight}x{workers}"
                processor = create_serde({"calibration": path, "object_ratio": 0, "max_workers": workers})
                try:
                    r = time_tasks(label, processor, chunks, "cuda", args.repeats, in_flight=args.tasks_in_flight)
                finally:
                    processor.close()
                r.update(chunks=name, waiter="fd", max_workers=workers)
                results["serdes"].append(r)
                log(f"{name:8s} {label:16s} cuda: ratio {r['ratio']:.4f}  serialize {r['serialize_gbps']:.1f} GB/s  "
                    f"deserialize {r['deserialize_gbps']:.1f} GB/s  ({args.tasks_in_flight} tasks of {len(chunks)} "
                    f"chunks in flight, {workers} worker{'s' if workers > 1 else ''})")
            if args.profile_serde:
                profile_serde(name, *gaac_pair(calibration, 1, 0), chunks)
            for batch, capsules in ((False, False), (True, False), (True, True)):
                r = time_codec(calibration, chunks, args.repeats, args.profile_serde, batch, capsules)
                r.update(chunks=name)
                results["serdes"].append(r)
                how = f"one encode_batch / decode_batch of {len(chunks)} chunks" if batch else "one call a chunk"
                how += ", arrays as DLPack capsules" if capsules else ""
                log(f"{name:8s} {r['serde']:16s} cuda: ratio {r['ratio']:.4f}  serialize {r['serialize_gbps']:.1f} GB/s  "
                    f"deserialize {r['deserialize_gbps']:.1f} GB/s  (gaac.ChunkCodec called directly, {how})")
            r = time_nvcomp(chunks, args.repeats)
            if r is None:
                log("nvCOMP: the nvidia.nvcomp package is not installed; skipped")
            else:
                r.update(chunks=name)
                results["serdes"].append(r)
                log(f"{name:8s} nvcomp-ans       cuda: ratio {r['ratio']:.4f}  serialize {r['serialize_gbps']:.1f} GB/s  "
                    f"deserialize {r['deserialize_gbps']:.1f} GB/s")

    if not args.skip_e2e:
        for io in io_modes:
            for serde in [None, *serde_configs]:
                with tempfile.TemporaryDirectory(prefix="gaac-e2e-", dir=args.e2e_dir) as directory:
                    r = e2e(eight_b, args.e2e_tokens, directory, serde, io == "odirect")
                results["e2e"].append(r)
                config = f"{serde[0]}x{serde[1]}" if serde else ""
                log(f"e2e {io:7s} {r['serde']:5s}{config:>5s} {r['tokens']} tokens: store {r['store_s']:.2f} s, "
                    f"load {r['load_s']:.2f} s, {r['bytes_on_disk'] / 2**30:.2f} GiB on disk")
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
