"""gaac on the GPU: a KvCacheMirror attends with the BF16 twin's bits and within BF16 rounding of the CPU's
gaac.attend, and decompresses every value back; a BatchKvCache grown on the device holds what a host cache
holds, steps captured in a CUDA graph give the bits of eager ones, and misuse is reported. Skipped without
CUDA (a gaac built without nvcc, or no GPU) or without PyTorch."""
import numpy as np
import pytest

import gaac

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not (gaac.cuda_available() and torch.cuda.is_available()), reason="no CUDA device")


def filled(fmt, k, v, lengths, table, windows):
    layers, kv_heads, head_dim = len(k), k[0].shape[1], k[0].shape[2]
    calib = table if fmt == "gaac" else None
    budget = gaac.KvCache.worst_case_budget(layers, kv_heads, head_dim, max(lengths), len(lengths), calib, fmt, windows)
    cache = gaac.KvCache(layers, kv_heads, head_dim, budget, calib, fmt, windows)
    ids = []
    for n in lengths:
        s = cache.add_sequence()
        cache.append(s, [a[:n] for a in k], [a[:n] for a in v])
        ids.append(s)
    return cache, ids


@pytest.mark.parametrize("shape", [(32, 8, 128), (9, 3, 64), (4, 1, 256)])
def test_gpu_attention_and_decompression(shape):
    q_heads, kv_heads, d = shape
    lengths = [1, 17, 1000, 2049]
    k, v = gaac.synthetic_kv(layers=2, kv_heads=kv_heads, head_dim=d, tokens=3000, seed=d)
    table = gaac.calibrate([a[2049:] for a in k], [a[2049:] for a in v])
    windows = [0, 300]
    host = {fmt: filled(fmt, k, v, lengths, table, windows) for fmt in ("gaac", "bf16")}
    device = {fmt: gaac.KvCacheMirror(c, ids) for fmt, (c, ids) in host.items()}
    rng = np.random.default_rng(2)
    q32 = (rng.standard_normal((len(lengths), q_heads, d)) * 0.5).astype(np.float32)
    q = torch.from_numpy(q32).to(torch.bfloat16).cuda()
    for layer in range(2):
        outs = {}
        split = device["gaac"].planned_blocks_per_split(layer, q_heads)  # the twin may plan another (occupancy)
        for fmt, dc in device.items():
            out = torch.full_like(q, float("nan"))
            dc.attend(layer, q, out, blocks_per_split=split, stream=torch.cuda.current_stream().cuda_stream)
            torch.cuda.synchronize()
            outs[fmt] = out.float().cpu().numpy()
        assert np.array_equal(outs["gaac"], outs["bf16"], equal_nan=False), f"layer {layer}: GAAC != BF16 twin"
        cpu_cache, ids = host["gaac"]
        cpu = gaac.attend(cpu_cache, layer, ids, q.float().cpu().numpy())
        for i in range(len(lengths)):
            for h in range(q_heads):
                err = np.linalg.norm(outs["gaac"][i, h] - cpu[i, h]) / max(np.linalg.norm(cpu[i, h]), 1e-30)
                assert err < 1e-2, f"layer {layer}, sequence {i}, head {h}: GPU vs CPU relative error {err:.2e}"
    longest = max(lengths)
    shape5 = (2, len(lengths), longest, kv_heads, d)
    ko = torch.zeros(shape5, dtype=torch.bfloat16, device="cuda")
    vo = torch.zeros(shape5, dtype=torch.bfloat16, device="cuda")
    device["gaac"].decompress(ko, vo)
    torch.cuda.synchronize()
    ko, vo = ko.view(torch.int16).cpu().numpy().view(np.uint16), vo.view(torch.int16).cpu().numpy().view(np.uint16)
    for layer in range(2):
        for i, n in enumerate(lengths):
            first = 0 if layer == 0 else (max(0, n - 300) // 16) * 16  # blocks before the window are released
            assert np.array_equal(ko[layer, i, first:n], k[layer][first:n])
            assert np.array_equal(vo[layer, i, first:n], v[layer][first:n])


def test_mirror_checks_its_arguments():
    k, v = gaac.synthetic_kv(layers=1, kv_heads=2, head_dim=64, tokens=40)
    cache, ids = filled("gaac", k, v, [40], gaac.calibrate(k, v), None)
    dc = gaac.KvCacheMirror(cache, ids)
    q = torch.zeros((1, 4, 64), dtype=torch.float32, device="cuda")
    with pytest.raises(gaac.GaacError, match="bfloat16"):
        dc.attend(0, q, torch.zeros_like(q))
    with pytest.raises(gaac.GaacError, match="elements"):
        dc.attend(0, q.bfloat16(), torch.zeros((1, 4, 32), dtype=torch.bfloat16, device="cuda"))


def grown(fmt, k, v, table, windows, batch, prefill, steps, stream, blocks_per_split=0):
    """A BatchKvCache filled on the GPU with `batch` copies of k/v offset by sequence: a prefill, then steps."""
    layers, kv_heads, head_dim = len(k), k[0].shape[1], k[0].shape[2]
    calib = table if fmt == "gaac" else None
    tokens = prefill + steps
    budget = gaac.KvCache.worst_case_budget(layers, kv_heads, head_dim, tokens, batch, calib, fmt, windows)
    dc = gaac.BatchKvCache(layers, kv_heads, head_dim, budget, calib, fmt, windows, batch=batch, max_tokens=tokens,
                           device="cuda", blocks_per_split=blocks_per_split)
    assert dc.device == "cuda"
    # [batch, kv_heads, tokens, head_dim] per layer: sequence b is tokens b*tokens .. of the synthetic KV.
    dev = [[torch.from_numpy(np.ascontiguousarray(a[b * tokens:(b + 1) * tokens])).view(torch.bfloat16)
            .transpose(0, 1).cuda() for b in range(batch)] for a in k + v]
    dev = [torch.stack(seqs) for seqs in dev]  # contiguous [batch, kv_heads, tokens, head_dim]
    for first, n in [(0, prefill)] + [(prefill + i, 1) for i in range(steps)]:
        dc.begin(n, stream=stream, attended=first > 0)  # the prefill is attended elsewhere
        for layer in range(layers):
            dc.write(layer, dev[layer][:, :, first:first + n], dev[layers + layer][:, :, first:first + n], stream)
    dc.check()
    return dc


def test_batch_cache_grows_on_the_device_like_the_host_cache():
    layers, kv_heads, d, batch, prefill, steps = 2, 2, 128, 3, 100, 40
    tokens = prefill + steps
    k, v = gaac.synthetic_kv(layers=layers, kv_heads=kv_heads, head_dim=d, tokens=batch * tokens + 1000, seed=5)
    table = gaac.calibrate([a[batch * tokens:] for a in k], [a[batch * tokens:] for a in v])
    windows = [0, 48]
    stream = torch.cuda.current_stream().cuda_stream
    q = (torch.randn((batch, 4 * kv_heads, 1, d), generator=torch.Generator().manual_seed(1)) * 0.5).bfloat16().cuda()
    for fmt in ("gaac", "bf16"):
        dc = grown(fmt, k, v, table, windows, batch, prefill, steps, stream, blocks_per_split=4)
        assert dc.lengths[0] == tokens
        calib = table if fmt == "gaac" else None
        budget = gaac.KvCache.worst_case_budget(layers, kv_heads, d, tokens, batch, calib, fmt, windows)
        host = gaac.KvCache(layers, kv_heads, d, budget, calib, fmt, windows)
        ids = [host.add_sequence() for _ in range(batch)]
        for b, s in enumerate(ids):
            rows = slice(b * tokens, (b + 1) * tokens)
            host.append(s, [a[rows][:prefill] for a in k], [a[rows][:prefill] for a in v])
            for i in range(prefill, tokens):
                host.append(s, [a[rows][i:i + 1] for a in k], [a[rows][i:i + 1] for a in v])
        mirror = gaac.KvCacheMirror(host, ids)
        hu, du = host.usage(), dc.usage()
        for key in ("compressed_tiles", "raw_tiles", "tail_tiles", "units_free", "resident_bytes", "bf16_bytes"):
            assert du[key] == hu[key], f"{fmt}: {key} {du[key]} on the device, {hu[key]} on the host"
        for layer in range(layers):
            a, b = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
            dc.attend(layer, q, a, stream=stream)
            mirror.attend(layer, q[:, :, 0], b[:, :, 0], blocks_per_split=4, stream=stream)
            torch.cuda.synchronize()
            assert torch.equal(a.view(torch.int16), b.view(torch.int16)), f"{fmt} layer {layer}: grown != host-filled"


def test_batch_cache_step_in_a_cuda_graph():
    """A decoding step (begin, then write and attend per layer) captured once and replayed while the sequence grows
    gives the bits of the same steps run one by one."""
    layers, kv_heads, d, prefill, steps = 2, 1, 256, 30, 20
    k, v = gaac.synthetic_kv(layers=layers, kv_heads=kv_heads, head_dim=d, tokens=prefill + steps + 600, seed=9)
    table = gaac.calibrate([a[prefill + steps:] for a in k], [a[prefill + steps:] for a in v])
    kt = [torch.from_numpy(np.ascontiguousarray(a)).view(torch.bfloat16).transpose(0, 1)[None].cuda() for a in k + v]
    q = (torch.randn((1, 4, 1, d), generator=torch.Generator().manual_seed(3)) * 0.5).bfloat16().cuda()
    results = {}
    for mode in ("eager", "graph"):
        budget = gaac.KvCache.worst_case_budget(layers, kv_heads, d, prefill + steps, 1, table, "gaac", [16, 0])
        dc = gaac.BatchKvCache(layers, kv_heads, d, budget, table, "gaac", [16, 0], max_tokens=prefill + steps,
                               device="cuda", blocks_per_split=1, plan_tokens=prefill + steps)
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            s = side.cuda_stream
            dc.begin(prefill, stream=s, attended=False)
            for layer in range(layers):
                dc.write(layer, kt[layer][:, :, :prefill], kt[layers + layer][:, :, :prefill], s)
            rows_k = [torch.zeros((1, kv_heads, 1, d), dtype=torch.bfloat16, device="cuda") for _ in range(layers)]
            rows_v = [torch.zeros_like(r) for r in rows_k]
            outs = [torch.zeros_like(q) for _ in range(layers)]

            def step():
                dc.begin(1, stream=s)
                for layer in range(layers):
                    dc.write(layer, rows_k[layer], rows_v[layer], s)
                    dc.attend(layer, q, outs[layer], stream=s)

            graph = None
            seen = []
            for i in range(steps):
                for layer in range(layers):
                    rows_k[layer].copy_(kt[layer][:, :, prefill + i:prefill + i + 1])
                    rows_v[layer].copy_(kt[layers + layer][:, :, prefill + i:prefill + i + 1])
                if mode == "eager" or i == 0:  # the first step eager: it sizes the workspace
                    step()
                elif graph is None:
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, stream=side):
                        step()
                    graph.replay()
                else:
                    graph.replay()
                    dc.note_replayed(1)
                seen.append(torch.cat(outs).view(torch.int16).clone())
        torch.cuda.synchronize()
        dc.check()
        assert dc.lengths[0] == prefill + steps
        results[mode] = torch.stack(seen)
    assert torch.equal(results["eager"], results["graph"])


def test_batch_cache_on_the_device_reports_misuse_and_running_out():
    budget = gaac.KvCache.worst_case_budget(1, 2, 64, 32, 1, None, "bf16", None)  # two blocks' units
    dc = gaac.BatchKvCache(1, 2, 64, budget, None, "bf16", max_tokens=48, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    rows = torch.zeros((1, 2, 16, 64), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(gaac.GaacError, match="CUDA device memory"):
        dc.write(0, rows.cpu(), rows.cpu(), stream)  # CPU tensors for a GPU cache
    for _ in range(2):
        dc.begin(16, stream=stream)
        dc.write(0, rows, rows, stream)
    with pytest.raises(gaac.CacheFullError, match="ran out"):
        dc.begin(16, stream=stream)  # the third block finds no free units
    with pytest.raises(gaac.CacheFullError, match="ran out"):
        dc.check()
    x = torch.zeros((1, 2, 3, 64), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(gaac.GaacError, match=r"\[1, 2, 16, 64\]"):
        dc.write(0, x, x, stream)
    dc.write(0, rows, rows, stream)
    with pytest.raises(gaac.GaacError, match="room for 48"):
        dc.begin(1, stream=stream)
    bad = gaac.BatchKvCache(1, 2, 64, budget, None, "bf16", max_tokens=48, device="cuda", plan_tokens=-1)
    bad.begin(1, stream=stream)
    one = torch.zeros((1, 2, 1, 64), dtype=torch.bfloat16, device="cuda")
    bad.write(0, one, one, stream)
    q = torch.zeros((1, 4, 1, 64), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(gaac.GaacError, match="positive"):
        bad.attend(0, q, torch.zeros_like(q), stream=stream)
    with pytest.raises(gaac.GaacError, match=r"\[1, 4, 16, 64\]"):  # 2 queries for a forward of 16 tokens
        dc.attend(0, torch.zeros((1, 4, 2, 64), dtype=torch.bfloat16, device="cuda"),
                  torch.zeros((1, 4, 2, 64), dtype=torch.bfloat16, device="cuda"), stream=stream)
