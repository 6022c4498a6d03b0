"""The Python package against the C++ library: bit-exact round trips on synthetic and real KV, .gaac bytes
equal to the CLI's, inputs from NumPy and PyTorch read the same, clear errors.

The CLI (for byte comparisons and real KV) is found through GAAC_CLI or in build/tools/gaac; real KV needs a
model in GAAC_MODEL_DIR (default ~/.cache/gaac/models). Tests that lack them skip, saying why, unless
GAAC_REQUIRE_MODELS=1 (as in CI), where a missing CLI or model is a failure.
"""
import os
import pathlib
import subprocess

import numpy as np
import pytest

import gaac

ROOT = pathlib.Path(__file__).resolve().parents[2]
REQUIRED = os.environ.get("GAAC_REQUIRE_MODELS") == "1"


def need(condition, why):
    if not condition:
        if REQUIRED:
            pytest.fail(why + " (GAAC_REQUIRE_MODELS=1)")
        pytest.skip(why)


def cli():
    path = pathlib.Path(os.environ.get("GAAC_CLI", ROOT / "build" / "tools" / "gaac" / "gaac"))
    need(path.is_file(), f"no gaac CLI at {path} (set GAAC_CLI)")
    return str(path)


def same(a_layers, b_layers):
    return len(a_layers) == len(b_layers) and all(
        a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(a_layers, b_layers))


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("tokens", [1, 15, 16, 17, 1003])
def test_round_trip_is_bit_exact(head_dim, tokens):
    k, v = gaac.synthetic_kv(layers=2, kv_heads=3, head_dim=head_dim, tokens=tokens, seed=tokens)
    snap = gaac.compress(k, v)
    k2, v2 = snap.decompress()
    assert same(k, k2) and same(v, v2)
    assert snap.layers == 2 and snap.bf16_bytes == sum(a.nbytes for a in k + v)
    if tokens >= 1000:
        assert snap.ratio > 1.3


def test_every_bf16_pattern_survives():
    patterns = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    k = [patterns.reshape(512, 1, 128)]
    v = [patterns[::-1].copy().reshape(512, 1, 128)]
    k2, v2 = gaac.compress(k, v).decompress()
    assert same(k, k2) and same(v, v2)


def test_snapshot_bytes_round_trip_and_files(tmp_path):
    k, v = gaac.synthetic_kv(layers=2, kv_heads=2, head_dim=128, tokens=300)
    snap = gaac.compress(k, v)
    again = gaac.Snapshot.from_bytes(snap.to_bytes())
    assert again.to_bytes() == snap.to_bytes()
    path = tmp_path / "kv.gaac"
    snap.save(str(path))
    assert path.read_bytes() == snap.to_bytes()
    loaded = gaac.Snapshot.load(str(path))
    assert same(loaded.decompress()[0], k)
    corrupt = bytearray(snap.to_bytes())
    corrupt[len(corrupt) // 2] ^= 0x10
    with pytest.raises(gaac.GaacError, match="checksum"):
        gaac.Snapshot.from_bytes(bytes(corrupt))


def test_calibration_reused_and_saved(tmp_path):
    k, v = gaac.synthetic_kv(layers=2, kv_heads=2, head_dim=64, tokens=500, seed=3)
    table = gaac.calibrate(k, v)
    assert (table.layers, table.kv_heads, table.head_dim) == (2, 2, 64)
    path = tmp_path / "calib.safetensors"
    table.save(str(path))
    loaded = gaac.Calibration.load(str(path))
    assert gaac.compress(k, v, loaded).to_bytes() == gaac.compress(k, v, table).to_bytes()
    assert gaac.compress(k, v, table).to_bytes() == gaac.compress(k, v).to_bytes()  # self-calibrated = same table
    assert gaac.compress(k, v, table).calibration().escape_capacity("v", 1) == table.escape_capacity("v", 1)


def test_strided_inputs_read_in_place():
    k, v = gaac.synthetic_kv(layers=1, kv_heads=4, head_dim=128, tokens=100)
    table = gaac.calibrate(k, v)
    # The same values in a [heads, tokens, dim] buffer, seen as [tokens, heads, dim]: not contiguous.
    strided = [np.ascontiguousarray(a.transpose(1, 0, 2)).transpose(1, 0, 2) for a in k]
    assert not strided[0].flags.c_contiguous
    assert gaac.compress(strided, v, table).to_bytes() == gaac.compress(k, v, table).to_bytes()


def test_errors_say_what_is_wrong():
    k, v = gaac.synthetic_kv(layers=2, kv_heads=2, head_dim=128, tokens=50)
    with pytest.raises(gaac.GaacError, match="layer 0 K: expected a bfloat16"):
        gaac.compress([k[0].astype(np.float32), k[1]], v)
    with pytest.raises(gaac.GaacError, match="expected \\[tokens, kv_heads, head_dim\\]"):
        gaac.compress([k[0].reshape(50, 256), k[1]], v)
    with pytest.raises(gaac.GaacError, match="2 K layers but 1 V layers"):
        gaac.compress(k, v[:1])
    other = gaac.calibrate(*gaac.synthetic_kv(layers=1, kv_heads=2, head_dim=128, tokens=50))
    with pytest.raises(gaac.GaacError):
        gaac.compress(k, v, other)  # one layer of calibration for two layers of KV
    with pytest.raises(gaac.GaacError, match="kind must be"):
        other.escape_capacity("q", 0)


def test_torch_tensors_cross_as_bfloat16():
    torch = pytest.importorskip("torch")
    k, v = gaac.synthetic_kv(layers=1, kv_heads=2, head_dim=128, tokens=64)
    kt = [gaac.to_torch(a) for a in k]
    vt = [gaac.to_torch(a) for a in v]
    assert kt[0].dtype == torch.bfloat16 and kt[0].data_ptr() == k[0].ctypes.data  # a view, not a copy
    assert gaac.compress(kt, vt).to_bytes() == gaac.compress(k, v).to_bytes()


def test_bytes_equal_the_cli(tmp_path):
    tool = cli()
    k, v = gaac.synthetic_kv(layers=3, kv_heads=2, head_dim=128, tokens=777, seed=9)
    dump, calib, out = tmp_path / "kv.safetensors", tmp_path / "calib.safetensors", tmp_path / "kv.gaac"
    gaac.save_kv_dump(k, v, str(dump))
    subprocess.run([tool, "calibrate", str(dump), "-o", str(calib)], check=True, capture_output=True)
    subprocess.run([tool, "compress", str(dump), "--calib", str(calib), "-o", str(out)], check=True, capture_output=True)
    assert gaac.compress(k, v, gaac.Calibration.load(str(calib))).to_bytes() == out.read_bytes()
    k2, v2 = gaac.load_kv_dump(str(dump))
    assert same(k, k2) and same(v, v2)


def test_real_kv_round_trip(tmp_path):
    tool = cli()
    models = pathlib.Path(os.environ.get("GAAC_MODEL_DIR", pathlib.Path.home() / ".cache" / "gaac" / "models"))
    model = models / "SmolLM2-135M-Instruct.Q4_1.gguf"
    need(model.is_file(), f"no SmolLM2 model at {model} (scripts/fetch_models.py)")
    dump = tmp_path / "real.safetensors"
    subprocess.run([tool, "capture", "-m", str(model), "--text", str(ROOT / "data" / "calibration_text.txt"),
                    "--tokens", "200", "-o", str(dump)], check=True, capture_output=True)
    k, v = gaac.load_kv_dump(str(dump))
    assert len(k) == 30 and k[0].shape == (200, 3, 64)
    snap = gaac.compress(k, v)
    k2, v2 = snap.decompress()
    assert same(k, k2) and same(v, v2)
    assert snap.ratio > 1.3
