"""The Python API's edges: only gaac.GaacError subclasses (and TypeError for arguments of the wrong Python
type) come out of it, whatever the files or arguments; paths may be any os.PathLike and never lose a part to a
NUL byte; read-only arrays are read; sizes past 2^64 are errors; requests far beyond a budget or a file of
endless bytes are refused before the work they would cost."""
import os
import pathlib
import random

import numpy as np
import pytest

import gaac


@pytest.fixture(scope="module")
def kv():
    return gaac.synthetic_kv(layers=2, kv_heads=2, head_dim=64, tokens=40)


def header_end(data):
    """The end of a safetensors file's JSON header."""
    return 8 + int.from_bytes(data[:8], "little")


def only_gaac_errors(load, data, file, positions, seed):
    """Writes `data` with one byte at each of `positions` replaced by a random byte and loads it: the load
    succeeds or raises a GaacError (never UnicodeDecodeError or another type)."""
    rng = random.Random(seed)
    for at in positions:
        bad = bytearray(data)
        bad[at] = rng.choice([0x80, 0xC3, 0xFF, 0xFE, rng.randrange(256)])
        file.write_bytes(bytes(bad))
        try:
            load(str(file))
        except gaac.GaacError:
            pass


def test_non_utf8_headers_raise_gaac_errors(kv, tmp_path):
    k, v = kv
    calibration, dump = tmp_path / "calib.safetensors", tmp_path / "kv.safetensors"
    gaac.calibrate(k, v).save(calibration)
    gaac.save_kv_dump(k, v, dump)
    for name, file, load in (("calib", calibration, gaac.Calibration.load), ("kv", dump, gaac.load_kv_dump)):
        data = file.read_bytes()
        only_gaac_errors(load, data, tmp_path / f"bad-{name}.safetensors", range(8, header_end(data)), seed=1)
    # A message quoting a byte that is not UTF-8 shows it escaped.
    data = bytearray(dump.read_bytes())
    data[data.index(b'"k.0"') + 1] = 0xFF
    bad = tmp_path / "quoted.safetensors"
    bad.write_bytes(bytes(data))
    with pytest.raises(gaac.GaacError):
        gaac.load_kv_dump(bad)


def test_paths_with_a_nul_byte_are_refused(kv, tmp_path):
    k, v = kv
    snap = gaac.compress(k, v)
    target = tmp_path / "x.gaac"
    with pytest.raises(gaac.GaacError, match="NUL"):
        snap.save(str(target) + "\0.gaac")
    assert not target.exists()
    snap.save(target)
    with pytest.raises(gaac.GaacError, match="NUL"):
        gaac.Snapshot.load(str(target) + "\0junk")
    with pytest.raises(gaac.GaacError, match="NUL"):
        gaac.load_kv_dump(str(tmp_path / "kv.safetensors") + "\0")
    with pytest.raises(gaac.GaacError, match="NUL"):
        gaac.save_kv_dump(k, v, str(tmp_path / "kv.safetensors") + "\0x")
    with pytest.raises(gaac.GaacError, match="NUL"):
        gaac.calibrate(k, v).save(str(tmp_path / "c.safetensors") + "\0")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.gaac"]


def test_path_like_arguments(kv, tmp_path):
    k, v = kv
    snap = gaac.compress(k, v)
    snap.save(tmp_path / "a.gaac")
    assert gaac.Snapshot.load(tmp_path / "a.gaac").to_bytes() == snap.to_bytes()
    gaac.save_kv_dump(k, v, tmp_path / "kv.safetensors")
    k2, _ = gaac.load_kv_dump(pathlib.Path(tmp_path, "kv.safetensors"))
    assert all(np.array_equal(a, b) for a, b in zip(k, k2))
    table = gaac.calibrate(k, v)
    table.save(tmp_path / "c.safetensors")
    assert gaac.Calibration.load(tmp_path / "c.safetensors").layers == 2
    assert gaac.Snapshot.load(os.fsencode(tmp_path / "a.gaac")).nbytes == snap.nbytes
    with pytest.raises(TypeError):
        gaac.Snapshot.load(3)


def test_sizes_past_64_bits_are_errors():
    with pytest.raises(gaac.GaacError, match="overflows"):
        gaac.KvCache.worst_case_budget(32, 8, 128, 2**31 - 1, 2**20, None, "bf16")
    with pytest.raises(gaac.GaacError, match="overflows"):
        gaac.KvCache.worst_case_budget(64, 64, 256, 2**30, 2**31 - 1, None, "bf16")
    # Within range the value is exact: 2^20 sequences of 2^20 tokens of one head of 64 channels.
    assert gaac.KvCache.worst_case_budget(1, 1, 64, 2**20, 2**20, None, "bf16") == 2**48 + (2**36 + 1) * 8


def test_to_torch_takes_only_bf16_bit_patterns():
    torch = pytest.importorskip("torch")
    bits = np.array([[0x3F80, 0xC000]], dtype=np.uint16)
    assert torch.equal(gaac.to_torch(bits).float(), torch.tensor([[1.0, -2.0]]))
    with pytest.raises(gaac.GaacError, match="float32"):
        gaac.to_torch(np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError):
        gaac.to_torch([1, 2])


@pytest.mark.parametrize("args", [dict(head_dim=100), dict(layers=0), dict(kv_heads=0), dict(tokens=-1),
                                  dict(layers=2**31 - 1, tokens=2**31 - 1)])
def test_synthetic_kv_checks_its_arguments(args):
    with pytest.raises(gaac.GaacError):
        gaac.synthetic_kv(**args)


def test_read_only_arrays_are_read(kv, tmp_path):
    k, v = kv

    def frozen(a):
        return np.frombuffer(a.tobytes(), dtype=np.uint16).reshape(a.shape)

    rk, rv = [frozen(a) for a in k], [frozen(a) for a in v]
    assert not rk[0].flags.writeable
    assert gaac.compress(rk, rv).to_bytes() == gaac.compress(k, v).to_bytes()
    np.save(tmp_path / "k0.npy", k[0])
    mapped = np.load(tmp_path / "k0.npy", mmap_mode="r")
    table = gaac.calibrate([mapped, rk[1]], rv)
    budget = gaac.KvCache.worst_case_budget(2, 2, 64, 40, 1, table)
    cache = gaac.KvCache(2, 2, 64, budget, table)
    s = cache.add_sequence()
    cache.append(s, rk, rv)
    assert np.array_equal(cache.read(s, 1, "v"), v[1])
    q = np.frombuffer(np.ones((1, 4, 64), np.float32).tobytes(), dtype=np.float32).reshape(1, 4, 64)
    assert gaac.attend(cache, 0, [s], q).shape == (1, 4, 64)


def test_appending_far_beyond_the_budget_fails_at_once(kv):
    k, v = kv
    table = gaac.calibrate(k, v)
    budget = gaac.KvCache.worst_case_budget(2, 2, 64, 64, 1, table)
    cache = gaac.KvCache(2, 2, 64, budget, table)
    s = cache.add_sequence()
    # 2^24 tokens repeating one row (stride 0, read-only): encoding them would take a minute and gigabytes.
    huge = [np.broadcast_to(a[:1], (2**24, 2, 64)) for a in k]
    with pytest.raises(gaac.CacheFullError, match=r"needs a budget of at least \d+ bytes; the budget is \d+ bytes"):
        cache.append(s, huge, huge)
    assert cache.length(s) == 0
    cache.check_invariants()


def test_a_refused_append_names_the_exact_budget(kv):
    k, v = kv
    table = gaac.calibrate(k, v)
    budget = gaac.KvCache.worst_case_budget(2, 2, 64, 16, 1, table)
    cache = gaac.KvCache(2, 2, 64, budget, table)
    # One token at a time: the append that fails opens a block (nothing to encode: the need is exact).
    def play(cache, tokens):
        s = cache.add_sequence()
        for t in range(tokens):
            cache.append(s, [a[t:t + 1] for a in k], [a[t:t + 1] for a in v])

    with pytest.raises(gaac.CacheFullError) as refused:
        play(cache, 40)
    message = str(refused.value)
    assert f"the budget is {budget} bytes" in message and "at least" not in message, message
    needed = int(message.split("needs a budget of ")[1].split(" ")[0])
    assert needed > budget
    play(gaac.KvCache(2, 2, 64, needed, table), 17)
    with pytest.raises(gaac.CacheFullError):
        play(gaac.KvCache(2, 2, 64, needed - 1, table), 17)


def test_an_endless_file_is_not_read_on():
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    with pytest.raises(gaac.GaacError, match="not a .gaac snapshot"):
        gaac.Snapshot.load("/dev/zero")
