"""gaac as LMCache's serde (gaac.lmcache), against the real lmcache package: LMCache's file-system L2 adapter
wrapped by its SerdeL2AdapterWrapper (built from the --l2-adapter JSON a user writes), with a real L1 manager,
stores and loads real-model KV chunks (both models, captured by the CLI; chunks of 256 tokens and a last one of
40) bit for bit; the files on disk take BF16 bytes / object_ratio; corrupted, truncated and foreign objects are
refused; many stores and loads run at once on LMCache's own serde worker threads; a task of GPU chunks is coded as
one batch. Also the serde alone: objects of their own size as small as `gaac stats` says, learning a calibration
once, clear errors.

Needs lmcache (tests/python/requirements.txt; skipped without it unless GAAC_REQUIRE_LMCACHE=1), the CLI (GAAC_CLI)
and the models (scripts/fetch_models.py; GAAC_REQUIRE_MODELS=1 makes a missing one a failure), or, in their place,
captures of both models' KV in GAAC_KV_DIR (as a GPU machine receives them). The CUDA path runs where a GPU and a
CUDA build of gaac are present.
"""
import argparse
import functools
import json
import os
import pathlib
import subprocess
import time

import pytest

torch = pytest.importorskip("torch")

import gaac  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODELS = pathlib.Path(os.environ.get("GAAC_MODEL_DIR", pathlib.Path.home() / ".cache" / "gaac" / "models"))
MODEL_FILES = {"smollm2": ("SmolLM2-135M-Instruct.Q4_1.gguf", 64), "gemma3": ("gemma-3-270m-q4_k_m.gguf", 256)}
TOKENS = 296  # a chunk of 256 tokens and one of 40, not a multiple of 16


def need(condition, why, flag):
    if not condition:
        if os.environ.get(flag) == "1":
            pytest.fail(f"{why} ({flag}=1)")
        pytest.skip(why)


def lmcache_modules():
    try:
        import gaac.lmcache as serde
        from lmcache.lmcache_native import Bitmap  # noqa: F401
        from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
        from lmcache.v1.distributed.config import L1ManagerConfig, L1MemoryManagerConfig
        from lmcache.v1.distributed.l1_manager import L1Manager
        from lmcache.v1.distributed.l2_adapters import create_l2_adapter
        from lmcache.v1.distributed.l2_adapters.config import add_l2_adapters_args, parse_args_to_l2_adapters_config
        from lmcache.v1.distributed.l2_adapters.serde_wrapper import SerdeL2AdapterWrapper
        from lmcache.v1.distributed.serde import create_serde_processor
    except ImportError as e:
        need(False, f"lmcache is not installed ({e})", "GAAC_REQUIRE_LMCACHE")
    return argparse.Namespace(**locals())


@functools.lru_cache(maxsize=None)
def real_chunks(model):
    """(chunks, head_dim): the model's KV of TOKENS tokens as LMCache chunks [2, layers, tokens, kv_heads *
    head_dim], one of 256 tokens and one of 40. Where GAAC_KV_DIR holds `<model>-gpl3-2048.safetensors`
    (scripts/bench_kv.sh's captures, or the one-layer cuts a GPU machine receives), its first TOKENS tokens;
    else TOKENS tokens of the calibration text captured from the model by the CLI."""
    file, head_dim = MODEL_FILES[model]
    captured = pathlib.Path(os.environ.get("GAAC_KV_DIR", "/nonexistent")) / f"{model}-gpl3-2048.safetensors"
    if captured.is_file():
        k, v = gaac.load_kv_dump(str(captured))
    else:
        tool = pathlib.Path(os.environ.get("GAAC_CLI", ROOT / "build" / "tools" / "gaac" / "gaac"))
        need(tool.is_file(), f"no gaac CLI at {tool} (set GAAC_CLI)", "GAAC_REQUIRE_MODELS")
        need((MODELS / file).is_file(), f"no model {MODELS / file} (scripts/fetch_models.py)", "GAAC_REQUIRE_MODELS")
        dump = pathlib.Path(os.environ.get("PYTEST_TMPDIR", "/tmp")) / f"gaac-lmcache-{os.getpid()}-{model}.safetensors"
        subprocess.run([str(tool), "capture", "-m", str(MODELS / file), "--text", str(ROOT / "data" / "calibration_text.txt"),
                        "--tokens", str(TOKENS), "-o", str(dump)], check=True, capture_output=True)
        k, v = gaac.load_kv_dump(str(dump))
        dump.unlink()
    full = torch.stack([torch.stack([gaac.to_torch(x).reshape(x.shape[0], -1)[:TOKENS] for x in layers])
                        for layers in (k, v)])
    assert full.shape[2] == TOKENS, f"{model}: {full.shape[2]} tokens captured, {TOKENS} needed"
    return [full[:, :, :256].contiguous(), full[:, :, 256:].contiguous()], head_dim


def same(a, b):
    return a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


class Store:
    """LMCache's fs L2 adapter wrapped with the serde of `serde_json` exactly as LMCache builds it from
    `--l2-adapter`, with a real L1 manager holding the chunks and the temporary buffers."""

    def __init__(self, m, base_path, serde_json, l1_bytes=512 << 20):
        parser = argparse.ArgumentParser()
        m.add_l2_adapters_args(parser)
        spec = {"type": "fs", "base_path": str(base_path), "serde": serde_json}
        config = m.parse_args_to_l2_adapters_config(parser.parse_args(["--l2-adapter", json.dumps(spec)])).adapters[0]
        self.m = m
        self.stored = {}
        self.l1 = m.L1Manager(m.L1ManagerConfig(memory_config=m.L1MemoryManagerConfig(size_in_bytes=l1_bytes, use_lazy=False,
                                                                                    shm_name="")))
        self.adapter = m.SerdeL2AdapterWrapper(inner=m.create_l2_adapter(config, self.l1.get_l1_memory_desc()),
                                               serde=m.create_serde_processor(config.serde_config), l1_manager=self.l1)

    def close(self):
        self.adapter.close()
        self.l1.close()

    def reserve(self, key, chunk):
        layout = self.m.MemoryLayoutDesc(shapes=[chunk.shape], dtypes=[chunk.dtype])
        result = self.l1.reserve_write([key], [False], layout)
        assert result[key][0].name == "SUCCESS", result
        return result[key][1]

    def put(self, keys, chunks):
        """Stores the chunks (through L1, as LMCache's store controller does) and returns the task id."""
        objects = []
        for key, chunk in zip(keys, chunks):
            obj = self.reserve(key, chunk)
            obj.tensor.copy_(chunk)
            objects.append(obj)
        self.l1.finish_write(keys)
        self.l1.reserve_read(keys)
        return self.adapter.submit_store_task(keys, objects)

    def wait_store(self, task, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.stored.update(self.adapter.pop_completed_store_tasks())  # every task done so far, popped once
            if task in self.stored:
                return self.stored.pop(task).is_successful()
            time.sleep(0.005)
        raise TimeoutError(f"store task {task} did not finish")

    def get(self, keys, shapes):
        """Loads the keys into fresh L1 buffers; returns (task id, buffers)."""
        temp = [self.m.ObjectKey(chunk_hash=k.chunk_hash + b"-load", model_name=k.model_name, kv_rank=k.kv_rank) for k in keys]
        buffers = [self.reserve(t, torch.empty(s, dtype=torch.bfloat16)) for t, s in zip(temp, shapes)]
        return self.adapter.submit_load_task(keys, buffers), buffers

    def wait_load(self, task, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            bitmap = self.adapter.query_load_result(task)
            if bitmap is not None:
                return bitmap.get_indices_list()
            time.sleep(0.005)
        raise TimeoutError(f"load task {task} did not finish")


def key_of(m, model, i):
    return m.ObjectKey(chunk_hash=i.to_bytes(8, "little"), model_name=f"test/{model}", kv_rank=0)


def files(directory):
    return sorted(p for p in pathlib.Path(directory).iterdir() if p.suffix == ".data")


@pytest.fixture
def store_factory(tmp_path):
    stores = []

    def make(serde_json, base_path=None):
        s = Store(lmcache_modules(), base_path or tmp_path / "l2", serde_json)
        stores.append(s)
        return s

    yield make
    for s in stores:
        s.close()


def calibration_file(tmp_path, model):
    chunks, head_dim = real_chunks(model)
    path = tmp_path / f"{model}.calibration.safetensors"
    gaac.calibrate_chunk(chunks[0], head_dim).save(str(path))
    return path


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_real_chunks_store_and_load_bit_exactly_through_the_fs_adapter(tmp_path, store_factory, model):
    m = lmcache_modules()
    chunks, head_dim = real_chunks(model)
    store = store_factory({"type": "gaac", "calibration": str(calibration_file(tmp_path, model)), "threads": 2})
    keys = [key_of(m, model, i) for i in range(len(chunks))]
    # One task per chunk size: LMCache's wrapper sizes a task's buffers by its first object.
    assert all(store.wait_store(store.put([k], [c])) for k, c in zip(keys, chunks))
    # On disk: every object exactly BF16 bytes / 1.38, rounded up to 4 KiB.
    sizes = {p.stat().st_size for p in files(tmp_path / "l2")}
    expected = {gaac.chunk_object_bytes(c.shape[1], c.shape[3] // head_dim, head_dim, c.shape[2], 1.38) for c in chunks}
    assert sizes == expected
    for c in chunks:  # the last chunk's 8 tokens past its 2 blocks are BF16, counted at their size
        size = gaac.chunk_object_bytes(c.shape[1], c.shape[3] // head_dim, head_dim, c.shape[2], 1.38)
        tail = c.numel() * 2 * (c.shape[2] % 16) // c.shape[2]
        assert (c.numel() * 2 - tail) / 1.38 + tail <= size < (c.numel() * 2 - tail) / 1.38 + tail + 4096 and size % 4096 == 0
    for key, chunk in zip(keys, chunks):
        task, buffers = store.get([key], [chunk.shape])
        assert store.wait_load(task) == [0]
        assert same(buffers[0].tensor, chunk)


def test_objects_of_their_own_size_are_as_small_as_gaac_stats_says(tmp_path):
    """object_ratio 0: each object its own size, about 1/1.40 of BF16, within 1% of `gaac stats` on the same
    values (its packed ratio counts the last chunk's 8 unblocked tokens as BF16 too)."""
    m = lmcache_modules()
    chunks, head_dim = real_chunks("smollm2")
    serde = m.serde.GaacSerde(calibration_file(tmp_path, "smollm2"), object_ratio=0)
    codec = serde.codec()
    total = 0
    for chunk in chunks:
        out = torch.empty(codec.object_bytes(chunk.shape[2]), dtype=torch.uint8)
        total += codec.encode(chunk, out, "k")
        back = torch.empty_like(chunk)
        codec.decode(out, back, "k")
        assert same(back, chunk)
    bf16 = sum(c.numel() * 2 for c in chunks)
    layers = chunks[0].shape[1]
    k = [torch.cat([c[0, l] for c in chunks]).reshape(TOKENS, -1, head_dim) for l in range(layers)]
    v = [torch.cat([c[1, l] for c in chunks]).reshape(TOKENS, -1, head_dim) for l in range(layers)]
    dump = tmp_path / "kv.safetensors"
    gaac.save_kv_dump(k, v, str(dump))
    assert bf16 / total > 1.38
    tool = pathlib.Path(os.environ.get("GAAC_CLI", ROOT / "build" / "tools" / "gaac" / "gaac"))
    need(tool.is_file(), f"no gaac CLI at {tool} (set GAAC_CLI)", "GAAC_REQUIRE_MODELS")
    stats = json.loads(subprocess.run([str(tool), "stats", str(dump), "--calib", str(tmp_path / "smollm2.calibration.safetensors"),
                                       "--json"], check=True, capture_output=True, text=True).stdout)
    assert abs(bf16 / total / stats["ratio"] - 1) < 0.01, (bf16 / total, stats["ratio"])


def test_corrupted_truncated_and_foreign_objects_are_refused(tmp_path, store_factory):
    m = lmcache_modules()
    chunks, head_dim = real_chunks("gemma3")
    calibration = calibration_file(tmp_path, "gemma3")
    store = store_factory({"type": "gaac", "calibration": str(calibration)})
    keys = [key_of(m, "gemma3", i) for i in range(4)]
    chunk = chunks[0]
    assert store.wait_store(store.put(keys, [chunk] * 4))
    paths = {p.name: p for p in files(tmp_path / "l2")}
    name = lambda k: next(n for n in paths if k.chunk_hash.hex() in n)  # noqa: E731
    # Key 0: one bit flipped in the middle. Key 1: cut to 60% of its bytes. Key 2: another key's object.
    data = bytearray(paths[name(keys[0])].read_bytes())
    data[len(data) // 2] ^= 0x10
    paths[name(keys[0])].write_bytes(bytes(data))
    whole = paths[name(keys[1])].read_bytes()
    cut = whole[:len(whole) * 6 // 10]
    paths[name(keys[1])].write_bytes(cut)
    paths[name(keys[2])].write_bytes(paths[name(keys[3])].read_bytes())
    for i in range(3):
        task, _ = store.get([keys[i]], [chunk.shape])
        assert store.wait_load(task) == [], f"a damaged object {i} was loaded"
    task, buffers = store.get([keys[3]], [chunk.shape])
    assert store.wait_load(task) == [0] and same(buffers[0].tensor, chunk)

    # What the serde says about each (LMCache logs it and reports the load failed).
    serde = m.serde.GaacSerde(calibration)
    object_bytes = serde.estimate(m.MemoryLayoutDesc(shapes=[chunk.shape], dtypes=[chunk.dtype]))
    codec, out = serde.codec(), torch.empty_like(chunk)

    def error(raw, key):
        buffer = torch.zeros(object_bytes, dtype=torch.uint8)
        buffer[:len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        with pytest.raises(gaac.GaacError) as e:
            codec.decode(buffer, out, m.serde.object_key(key))
        return str(e.value)

    assert "checksum mismatch" in error(bytes(data), keys[0])
    assert "checksum mismatch" in error(cut, keys[1])  # what a buffer of zeros after the bytes read makes of it
    assert "stored under another key" in error(paths[name(keys[2])].read_bytes(), keys[2])
    other = tmp_path / "other.safetensors"
    gaac.calibrate_chunk(chunks[0][:, :, :128].contiguous(), head_dim).save(str(other))
    assert "was made with calibration" in str(pytest.raises(gaac.GaacError, m.serde.GaacSerde(other).codec().decode,
                                                            torch.frombuffer(bytearray(whole), dtype=torch.uint8), out,
                                                            m.serde.object_key(keys[1])).value)
    smollm2 = m.serde.GaacSerde(calibration_file(tmp_path, "smollm2"))
    with pytest.raises(gaac.GaacError, match="KV heads"):
        smollm2.codec().decode(torch.frombuffer(bytearray(whole), dtype=torch.uint8), real_chunks("smollm2")[0][0].clone(),
                               m.serde.object_key(keys[1]))


def test_many_stores_and_loads_at_once_on_lmcaches_worker_threads(tmp_path, store_factory):
    m = lmcache_modules()
    chunks, _ = real_chunks("smollm2")
    chunk = chunks[0]
    store = store_factory({"type": "gaac", "calibration": str(calibration_file(tmp_path, "smollm2")), "threads": 2,
                           "max_workers": 4})
    # 16 distinct chunks (the real one with one value changed each), stored as 8 tasks of 2 in flight together,
    # then loaded as 4 tasks of 4 in flight together.
    variants = []
    for i in range(16):
        c = chunk.clone()
        c.view(torch.int16).view(-1)[i * 997] ^= 1
        variants.append(c)
    keys = [key_of(m, "smollm2", i) for i in range(16)]
    tasks = [store.put(keys[i:i + 2], variants[i:i + 2]) for i in range(0, 16, 2)]
    assert all(store.wait_store(t) for t in tasks)
    loads = [store.get(keys[i:i + 4], [chunk.shape] * 4) for i in range(0, 16, 4)]
    for n, (task, buffers) in enumerate(loads):
        assert store.wait_load(task) == [0, 1, 2, 3]
        for j, b in enumerate(buffers):
            assert same(b.tensor, variants[4 * n + j])


def test_a_calibration_is_learnt_once_from_the_first_chunk(tmp_path, store_factory):
    m = lmcache_modules()
    chunks, head_dim = real_chunks("gemma3")
    path = tmp_path / "learnt.safetensors"
    with pytest.raises(FileNotFoundError, match="gaac calibrate"):
        m.serde.create_serde({"calibration": str(path)})
    with pytest.raises(ValueError, match="unknown option"):
        m.serde.create_serde({"calibration": str(path), "learn": True, "head_dim": head_dim, "ratio": 1.3})
    store = store_factory({"type": "gaac", "calibration": str(path), "learn": True, "head_dim": head_dim})
    keys = [key_of(m, "gemma3", i) for i in range(2)]
    assert store.wait_store(store.put(keys[:1], chunks[:1]))
    assert path.is_file()
    learnt = gaac.Calibration.load(str(path))
    assert gaac.ChunkCodec(learnt).calibration_id == gaac.ChunkCodec(gaac.calibrate_chunk(chunks[0], head_dim)).calibration_id
    assert store.wait_store(store.put(keys[1:], chunks[1:]))
    # Another store (another process) finds the table and reads what the first wrote.
    other = store_factory({"type": "gaac", "calibration": str(path), "learn": True, "head_dim": head_dim})
    for key, chunk in zip(keys, chunks):
        task, buffers = other.get([key], [chunk.shape])
        assert other.wait_load(task) == [0] and same(buffers[0].tensor, chunk)


def test_layouts_gaac_does_not_take_are_refused_up_front(tmp_path):
    m = lmcache_modules()
    serde = m.serde.GaacSerde(calibration_file(tmp_path, "smollm2"))
    for shapes, dtypes, message in [
        ([torch.Size([2, 30, 256, 192])], [torch.float16], "bfloat16"),
        ([torch.Size([30, 256, 192])], [torch.bfloat16], "shape"),
        ([torch.Size([2, 30, 256, 192])] * 2, [torch.bfloat16] * 2, "kernel groups"),
        ([torch.Size([2, 30, 256, 200])], [torch.bfloat16], "heads of 64"),
    ]:
        with pytest.raises(ValueError, match=message):
            serde.estimate(m.MemoryLayoutDesc(shapes=shapes, dtypes=dtypes))
    ok = serde.estimate(m.MemoryLayoutDesc(shapes=[torch.Size([2, 30, 256, 192])], dtypes=[torch.bfloat16]))
    assert ok == gaac.chunk_object_bytes(30, 3, 64, 256, 1.38)
    exact = m.serde.GaacSerde(tmp_path / "smollm2.calibration.safetensors", object_ratio=0)
    assert exact.estimate(m.MemoryLayoutDesc(shapes=[torch.Size([2, 30, 256, 192])], dtypes=[torch.bfloat16])) >= 2 * 30 * 256 * 192 * 2


def test_the_processor_takes_the_bytes_lmcache_objects_hold(tmp_path):
    """What the batch path hands the codec of LMCache's memory objects is their logical bytes, as .tensor holds
    them (gaac.lmcache.object_bytes, chunk_data): the layout's size, or a narrowed size once set; None for an
    invalidated object. A chunk's layout is checked against the calibration before its bytes are read as one
    (GaacSerde.check_chunks)."""
    m = lmcache_modules()
    from lmcache.v1.memory_management import MemoryObjMetadata, TensorMemoryObj

    def memory_obj(tensor, padding):
        raw = torch.cat([tensor.reshape(-1).view(torch.uint8), torch.zeros(padding, dtype=torch.uint8)])
        meta = MemoryObjMetadata(shape=tensor.shape, dtype=tensor.dtype, address=0, phy_size=raw.numel(), ref_count=1,
                                 shapes=[tensor.shape], dtypes=[tensor.dtype])
        return TensorMemoryObj(raw, meta, None), raw

    buffer, raw = memory_obj(torch.arange(1000, dtype=torch.int32).to(torch.uint8), padding=24)
    flat = m.serde.object_bytes(buffer)
    assert flat.dtype == torch.uint8 and flat.shape == (1000,) and flat.data_ptr() == raw.data_ptr()
    assert torch.equal(flat, buffer.tensor.view(-1))
    buffer.set_used_size(300)
    assert torch.equal(m.serde.object_bytes(buffer), buffer.tensor) and m.serde.object_bytes(buffer).numel() == 300
    buffer.invalidate()
    assert m.serde.object_bytes(buffer) is None

    # The geometry is the data's: whole caches here, one-layer cuts where a GPU machine receives them.
    serde = m.serde.GaacSerde(calibration_file(tmp_path, "smollm2"))
    chunk = real_chunks("smollm2")[0][1]
    obj, raw = memory_obj(chunk, padding=64)
    data = m.serde.chunk_data(obj)
    assert data.dtype == torch.uint8 and data.numel() == chunk.numel() * 2 and data.data_ptr() == raw.data_ptr()
    assert torch.equal(data, obj.tensor.reshape(-1).view(torch.uint8))
    serde.check_chunks([obj])
    layers, heads = serde.geometry
    assert (layers, heads * 64) == (chunk.shape[1], chunk.shape[3])
    for shape in ([2, layers + 1, 40, heads * 64], [2, layers, 40, (heads - 1) * 64]):  # other layers, other heads
        other, _ = memory_obj(torch.zeros(shape, dtype=torch.bfloat16), padding=0)
        with pytest.raises(ValueError, match=f"the calibration has {layers} and {heads}$"):
            serde.check_chunks([obj, other])


def test_a_chunk_may_be_given_to_the_codec_as_its_bytes(tmp_path):
    """gaac.ChunkCodec takes a chunk as its dense bytes (a 1-D uint8 array, as LMCache's memory objects hold it):
    the same object as from the shaped chunk, decoded back into bytes bit for bit; sizes that are not whole tokens
    of the calibration's geometry and unaligned bytes are refused."""
    chunks, _ = real_chunks("smollm2")
    codec = gaac.ChunkCodec(gaac.Calibration.load(str(calibration_file(tmp_path, "smollm2"))))
    for chunk in chunks:
        expected = torch.empty(codec.object_bytes(chunk.shape[2]), dtype=torch.uint8)
        n = codec.encode(chunk, expected, "k")
        data = chunk.contiguous().reshape(-1).view(torch.uint8)
        out = torch.empty_like(expected)
        assert codec.encode(data, out, "k") == n and torch.equal(out[:n], expected[:n])
        back = torch.zeros_like(data)
        codec.decode(out, back, "k")
        assert torch.equal(back, data)
    token = 2 * 2 * chunks[0].shape[1] * chunks[0].shape[3]
    data = chunks[0].contiguous().reshape(-1).view(torch.uint8)
    with pytest.raises(gaac.GaacError, match="whole tokens"):
        codec.encode(data[:-token // 2], out, "k")
    unaligned = torch.empty(data.numel() + 1, dtype=torch.uint8)[1:]
    unaligned.copy_(data)
    with pytest.raises(gaac.GaacError, match="aligned"):
        codec.encode(unaligned, out, "k")


def test_chunks_on_a_gpu_are_coded_there(tmp_path):
    m = lmcache_modules()
    if not (gaac.cuda_available() and torch.cuda.is_available()):
        pytest.skip("no CUDA device (or gaac built without CUDA)")
    for model in ("smollm2", "gemma3"):
        chunks, head_dim = real_chunks(model)
        serde = m.serde.GaacSerde(calibration_file(tmp_path, model), object_ratio=0)
        codec = serde.codec()
        for chunk in chunks:
            out_cpu = torch.empty(codec.object_bytes(chunk.shape[2]), dtype=torch.uint8)
            n = codec.encode(chunk, out_cpu, "k")
            device_chunk = chunk.cuda()
            out = torch.zeros(codec.object_bytes(chunk.shape[2]), dtype=torch.uint8, device="cuda")
            stream = torch.cuda.current_stream().cuda_stream
            assert codec.encode(device_chunk, out, "k", stream) == n
            assert torch.equal(out[:n].cpu(), out_cpu[:n]), "the GPU's object differs from the CPU's"
            back = torch.empty_like(device_chunk)
            codec.decode(out, back, "k", stream)
            assert same(back.cpu(), chunk)
            # A bit flipped in a section's bytes (a nonzero byte: the padding between sections is zero, and
            # refused as such before the checksums are read).
            payload = torch.nonzero(out[n // 2:n]).flatten()
            bad = out.clone()
            bad[n // 2 + int(payload[0])] ^= 4
            with pytest.raises(gaac.GaacError, match="checksum mismatch"):
                codec.decode(bad, back, "k", stream)


def test_a_task_of_gpu_chunks_is_coded_as_one_batch(tmp_path):
    """A task of chunks in GPU memory, as LMCache's wrapper hands the serde processor a store or a load: coded as one
    batch (more chunks than the codec keeps in flight), each object the CPU's byte for byte, every chunk back bit for
    bit; a load task with one object stored under another key fails (LMCache then recomputes), its error logged."""
    m = lmcache_modules()
    if not (gaac.cuda_available() and torch.cuda.is_available()):
        pytest.skip("no CUDA device (or gaac built without CUDA)")
    from lmcache.v1.memory_management import MemoryObjMetadata, TensorMemoryObj

    def memory_obj(tensor):
        raw = tensor.reshape(-1).view(torch.uint8)
        meta = MemoryObjMetadata(shape=tensor.shape, dtype=tensor.dtype, address=0, phy_size=raw.numel(), ref_count=1,
                                 shapes=[tensor.shape], dtypes=[tensor.dtype])
        return TensorMemoryObj(raw, meta, None)

    def finish(query, task):
        deadline = time.monotonic() + 60
        while (result := query(task)) is None:
            assert time.monotonic() < deadline, f"task {task} did not finish"
            time.sleep(0.001)
        return result

    for model in ("smollm2", "gemma3"):
        full, _ = real_chunks(model)
        chunks = [full[i % 2] for i in range(11)]  # 256 and 40 tokens in turn
        path = calibration_file(tmp_path, model)
        processor = m.serde.create_serde({"calibration": str(path), "object_ratio": 0})
        assert isinstance(processor, m.serde.GaacSerdeProcessor)
        try:
            keys = [key_of(m, model, i) for i in range(len(chunks))]
            srcs = [memory_obj(c.cuda()) for c in chunks]
            dsts = [memory_obj(torch.zeros(processor.serde.codec().object_bytes(c.shape[2]), dtype=torch.uint8, device="cuda"))
                    for c in chunks]
            assert finish(processor.query_serialize_result, processor.submit_serialize(srcs, dsts, keys)) is True
            codec = processor.serde.codec()
            for chunk, dst, key in zip(chunks, dsts, keys):
                expected = torch.empty(codec.object_bytes(chunk.shape[2]), dtype=torch.uint8)
                n = codec.encode(chunk, expected, m.serde.object_key(key))
                assert dst.get_size() == n
                assert torch.equal(dst.tensor.cpu(), expected[:n]), "the batch's object differs from the CPU's"
            backs = [torch.empty_like(c, device="cuda") for c in chunks]
            outs = [memory_obj(b) for b in backs]
            assert finish(processor.query_deserialize_result, processor.submit_deserialize(dsts, outs, keys)) is True
            assert all(same(b.cpu(), c) for b, c in zip(backs, chunks))
            swapped = keys[:-2] + [keys[-1], keys[-2]]
            assert finish(processor.query_deserialize_result, processor.submit_deserialize(dsts, outs, swapped)) is False
        finally:
            processor.close()
