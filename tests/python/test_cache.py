"""gaac.KvCache and gaac.attend from Python: values read back bit for bit through appends of uneven sizes,
forks, frees and sliding windows; accounting; a full cache left unchanged; attention over a GAAC cache equal
to the BF16 twin's bit for bit and to a float64 reference within BF16 rounding."""
import numpy as np
import pytest

import gaac

STEPS = [1, 37, 3, 16, 90, 2, 300, 5]


def fill(cache, k, v, sequence=None):
    s = cache.add_sequence() if sequence is None else sequence
    at, i = 0, 0
    while at < k[0].shape[0]:
        n = min(STEPS[i % len(STEPS)], k[0].shape[0] - at)
        cache.append(s, [a[at:at + n] for a in k], [a[at:at + n] for a in v])
        at, i = at + n, i + 1
    return s


def caches(layers, kv_heads, head_dim, tokens, sequences, table, windows=None):
    both = {}
    for fmt, calib in (("gaac", table), ("bf16", None)):
        budget = gaac.KvCache.worst_case_budget(layers, kv_heads, head_dim, tokens, sequences, calib, fmt, windows)
        both[fmt] = gaac.KvCache(layers, kv_heads, head_dim, budget, calib, fmt, windows)
    return both


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_values_come_back_and_accounting(head_dim):
    k, v = gaac.synthetic_kv(layers=2, kv_heads=2, head_dim=head_dim, tokens=700, seed=head_dim)
    table = gaac.calibrate([a[300:] for a in k], [a[300:] for a in v])  # windows learnt on other tokens
    for fmt, cache in caches(2, 2, head_dim, 300, 1, table).items():
        s = fill(cache, [a[:300] for a in k], [a[:300] for a in v])
        cache.check_invariants()
        assert cache.length(s) == 300
        for layer in range(2):
            assert np.array_equal(cache.read(s, layer, "k"), k[layer][:300])
            assert np.array_equal(cache.read(s, layer, "v", 17, 100), v[layer][17:117])
        u = cache.usage()
        assert u["bf16_bytes"] == 2 * 2 * 2 * 300 * 2 * head_dim
        if fmt == "gaac":
            assert u["compressed_tiles"] > 0 and u["resident_bytes"] < u["bf16_bytes"]
        else:
            assert u["compressed_tiles"] == 0


def test_forks_share_and_frees_release():
    k, v = gaac.synthetic_kv(layers=1, kv_heads=2, head_dim=128, tokens=200)
    cache = caches(1, 2, 128, 200, 3, gaac.calibrate(k, v))["gaac"]
    parent = fill(cache, k, v)
    before = cache.usage()["resident_bytes"]
    child = cache.fork(parent)
    assert cache.usage()["resident_bytes"] < 2 * before  # complete blocks shared
    cache.append(child, [a[:5] for a in k], [a[:5] for a in v])
    assert np.array_equal(cache.read(child, 0, "k", 0, 200), k[0]) and cache.length(parent) == 200
    cache.free(parent)
    assert np.array_equal(cache.read(child, 0, "v", 195, 10), np.concatenate([v[0][195:], v[0][:5]]))
    cache.free(child)
    cache.check_invariants()
    assert cache.usage()["units_free"] == cache.usage()["units"]
    with pytest.raises(gaac.GaacError, match="not in the cache"):
        cache.length(child)


def test_a_full_cache_is_left_unchanged():
    k, v = gaac.synthetic_kv(layers=2, kv_heads=2, head_dim=64, tokens=400)
    cache = gaac.KvCache(2, 2, 64, 150_000, gaac.calibrate(k, v))
    s = cache.add_sequence()
    with pytest.raises(gaac.CacheFullError, match="the cache is unchanged"):
        for at in range(0, 400, 16):
            before = (cache.length(s), cache.usage())
            cache.append(s, [a[at:at + 16] for a in k], [a[at:at + 16] for a in v])
    assert (cache.length(s), cache.usage()) == before
    assert np.array_equal(cache.read(s, 1, "k"), k[1][:cache.length(s)])
    assert not cache.can_append(s, 16 * 100)
    cache.check_invariants()


def reference_attention(q, k, v, scale):
    """float64 softmax attention of q [q_heads, d] over k, v [tokens, kv_heads, d] (BF16 bit patterns); q is
    rounded to BF16 first, as llama.cpp's arithmetic (which gaac.attend follows) does before Q·K."""
    def f(a):
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    bits = q.astype(np.float32).view(np.uint32)
    q = f(((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16))
    kf, vf = f(k), f(v)
    group = q.shape[0] // k.shape[1]
    out = np.empty(q.shape)
    for h in range(q.shape[0]):
        s = kf[:, h // group] @ q[h].astype(np.float64) * scale
        p = np.exp(s - s.max())
        out[h] = p @ vf[:, h // group] / p.sum()
    return out


@pytest.mark.parametrize("shape", [(9, 3, 64), (4, 1, 256), (8, 2, 128)])
def test_attention_gaac_equals_bf16_twin(shape):
    q_heads, kv_heads, d = shape
    k, v = gaac.synthetic_kv(layers=2, kv_heads=kv_heads, head_dim=d, tokens=1500, seed=d)
    table = gaac.calibrate([a[1000:] for a in k], [a[1000:] for a in v])
    lengths = [1, 17, 333, 1000]
    both = caches(2, kv_heads, d, 1000, len(lengths), table, [0, 128])
    seqs = {fmt: [fill(c, [a[:n] for a in k], [a[:n] for a in v]) for n in lengths] for fmt, c in both.items()}
    rng = np.random.default_rng(1)
    q = (rng.standard_normal((len(lengths), q_heads, d)) * 0.5).astype(np.float32)
    for layer in range(2):
        for path in ("fused", "reference"):
            g = gaac.attend(both["gaac"], layer, seqs["gaac"], q, path=path)
            b = gaac.attend(both["bf16"], layer, seqs["bf16"], q, path=path)
            assert g.dtype == np.float32 and g.shape == q.shape
            assert np.array_equal(g, b), f"layer {layer} {path}: GAAC differs from its BF16 twin"
        for i, n in enumerate(lengths):
            first = max(0, n - 128) if layer == 1 else 0
            want = reference_attention(q[i], k[layer][first:n], v[layer][first:n], 1 / np.sqrt(d))
            for h in range(q_heads):  # relative L2 error of each head's output
                err = np.linalg.norm(g[i, h] - want[h]) / max(np.linalg.norm(want[h]), 1e-30)
                assert err <= 1e-4, f"layer {layer}, length {n}, head {h}: relative error {err:.2e}"


def test_attention_arguments_are_checked():
    k, v = gaac.synthetic_kv(layers=1, kv_heads=2, head_dim=64, tokens=40)
    cache = caches(1, 2, 64, 40, 1, gaac.calibrate(k, v))["gaac"]
    s = fill(cache, k, v)
    with pytest.raises(gaac.GaacError, match="float32"):
        gaac.attend(cache, 0, [s], np.zeros((1, 4, 128), np.float32))
    with pytest.raises(gaac.GaacError):
        gaac.attend(cache, 0, [s], np.zeros((1, 3, 64), np.float32))  # 3 query heads over 2 KV heads
    with pytest.raises(gaac.GaacError, match="path must be"):
        gaac.attend(cache, 0, [s], np.zeros((1, 4, 64), np.float32), path="fast")


def test_calibration_sample_is_at_least_a_block():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from gaac.transformers import spread_positions

    assert torch.equal(spread_positions(64, 32), torch.cat([torch.arange(0, 16), torch.arange(32, 48)]))
    assert torch.equal(spread_positions(40, 4096), torch.arange(40))
    with pytest.raises(gaac.GaacError, match="at least 16"):
        spread_positions(8192, 0)
