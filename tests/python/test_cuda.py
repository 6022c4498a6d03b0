"""gaac.DeviceCache on the GPU: decode attention over a GAAC cache equals the BF16 twin's bit for bit and the
CPU's gaac.attend within BF16 rounding; decompression gives back every value. Skipped without CUDA (a gaac
built without nvcc, or no GPU) or without PyTorch."""
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
    device = {fmt: gaac.DeviceCache(c, ids) for fmt, (c, ids) in host.items()}
    rng = np.random.default_rng(2)
    q32 = (rng.standard_normal((len(lengths), q_heads, d)) * 0.5).astype(np.float32)
    q = torch.from_numpy(q32).to(torch.bfloat16).cuda()
    for layer in range(2):
        outs = {}
        split = device["gaac"].plan(layer, q_heads)  # the twin may plan another split (its occupancy differs)
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


def test_device_cache_checks_its_arguments():
    k, v = gaac.synthetic_kv(layers=1, kv_heads=2, head_dim=64, tokens=40)
    cache, ids = filled("gaac", k, v, [40], gaac.calibrate(k, v), None)
    dc = gaac.DeviceCache(cache, ids)
    q = torch.zeros((1, 4, 64), dtype=torch.float32, device="cuda")
    with pytest.raises(gaac.GaacError, match="bfloat16"):
        dc.attend(0, q, torch.zeros_like(q))
    with pytest.raises(gaac.GaacError, match="elements"):
        dc.attend(0, q.bfloat16(), torch.zeros((1, 4, 32), dtype=torch.bfloat16, device="cuda"))
