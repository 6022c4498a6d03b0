"""FP8 caches through the Python package: the conversion equals PyTorch's saturating cast bit for bit, torch
float8 tensors and uint8 arrays compress to the same bytes as the CLI, every FP8 byte pattern comes back, the
scales travel with the snapshot, and mistakes are clear errors.
"""
import os
import pathlib
import subprocess

import numpy as np
import pytest

import gaac

ROOT = pathlib.Path(__file__).resolve().parents[2]
REQUIRED = os.environ.get("GAAC_REQUIRE_MODELS") == "1"
FORMATS = ["e4m3", "e5m2"]


def cli():
    path = pathlib.Path(os.environ.get("GAAC_CLI", ROOT / "build" / "tools" / "gaac" / "gaac"))
    if not path.is_file():
        if REQUIRED:
            pytest.fail(f"no gaac CLI at {path} (GAAC_REQUIRE_MODELS=1)")
        pytest.skip(f"no gaac CLI at {path} (set GAAC_CLI)")
    return str(path)


def same(a_layers, b_layers):
    return len(a_layers) == len(b_layers) and all(
        a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(a_layers, b_layers))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scale", ["per-tensor", "none"])
def test_conversion_equals_torch_saturating_cast(fmt, scale):
    torch = pytest.importorskip("torch")
    dtype, largest = (torch.float8_e4m3fn, 448.0) if fmt == "e4m3" else (torch.float8_e5m2, 57344.0)
    k, v = gaac.synthetic_kv(layers=2, kv_heads=2, head_dim=64, tokens=50, seed=4)
    k[0][0, 0, :4] = [0x7F80, 0xFF80, 0x4780, 0xC780]  # ±Inf and ±65536: saturated
    k8, v8, ks, vs = gaac.convert_to_fp8(k, v, fmt, scale)
    for bf16, fp8, scales in ((k, k8, ks), (v, v8, vs)):
        for layer, (x, y) in enumerate(zip(bf16, fp8)):
            values = gaac.to_torch(x).float()
            finite = values[values.isfinite()]
            expected_scale = (finite.abs().max() / largest).item() if scale == "per-tensor" else 1.0
            assert scales[layer] == pytest.approx(expected_scale, rel=0, abs=0)
            want = (values / torch.tensor(scales[layer])).clamp(-largest, largest).to(dtype).view(torch.uint8)
            assert np.array_equal(want.numpy(), y)


@pytest.mark.parametrize("fmt", FORMATS)
def test_torch_float8_and_uint8_compress_alike_and_round_trip(fmt):
    torch = pytest.importorskip("torch")
    k, v = gaac.synthetic_kv(layers=2, kv_heads=1, head_dim=256, tokens=77, seed=2)
    k8, v8, ks, vs = gaac.convert_to_fp8(k, v, fmt)
    kt = [gaac.to_torch(a, fmt) for a in k8]
    vt = [gaac.to_torch(a, fmt) for a in v8]
    assert kt[0].dtype == (torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2)
    assert kt[0].data_ptr() == k8[0].ctypes.data  # a view, not a copy
    snap = gaac.compress(kt, vt, k_scales=ks, v_scales=vs)
    assert snap.to_bytes() == gaac.compress(k8, v8, format=fmt, k_scales=ks, v_scales=vs).to_bytes()
    assert snap.element_format == fmt and snap.ratio > 1.05
    assert gaac.calibrate(kt, vt).element_format == fmt
    k2, v2 = gaac.Snapshot.from_bytes(snap.to_bytes()).decompress()
    assert same(k8, k2) and same(v8, v2)
    assert snap.scales() == (ks, vs)
    assert gaac.compress(k8, v8, format=fmt).scales() is None


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_fp8_pattern_survives(fmt):
    patterns = np.arange(256, dtype=np.uint8)
    k = [np.resize(patterns, (48, 2, 128)).copy()]
    v = [np.resize(patterns[::-1], (48, 2, 128)).copy()]
    k2, v2 = gaac.compress(k, v, format=fmt).decompress()
    assert same(k, k2) and same(v, v2)


def test_fp8_bytes_equal_the_cli(tmp_path):
    tool = cli()
    k, v = gaac.synthetic_kv(layers=2, kv_heads=2, head_dim=128, tokens=90, seed=3)
    dump, fp8, calib, out = (tmp_path / n for n in ("kv.safetensors", "fp8.safetensors", "calib.safetensors", "kv.gaac"))
    gaac.save_kv_dump(k, v, str(dump))
    subprocess.run([tool, "convert", str(dump), "--to", "e5m2", "-o", str(fp8)], check=True, capture_output=True)
    subprocess.run([tool, "calibrate", str(fp8), "-o", str(calib)], check=True, capture_output=True)
    subprocess.run([tool, "compress", str(fp8), "--calib", str(calib), "-o", str(out)], check=True, capture_output=True)
    k8, v8, ks, vs = gaac.convert_to_fp8(k, v, "e5m2")
    table = gaac.Calibration.load(str(calib))
    assert table.element_format == "e5m2"
    ours, theirs = gaac.compress(k8, v8, table, format="e5m2", k_scales=ks, v_scales=vs), gaac.Snapshot.load(str(out))
    # The same FP8 bytes, scales and slots (the CLI's dump also carries its conversion in its metadata).
    assert theirs.element_format == "e5m2" and theirs.scales() == ours.scales()
    k_ours, v_ours = ours.decompress()
    k_theirs, v_theirs = theirs.decompress()
    assert same(k_ours, k_theirs) and same(v_ours, v_theirs) and same(k8, k_ours)
    assert abs(theirs.nbytes - ours.nbytes) < 256


def test_fp8_mistakes_are_clear_errors():
    k, v = gaac.synthetic_kv(layers=1, kv_heads=1, head_dim=64, tokens=32)
    k8, v8, ks, vs = gaac.convert_to_fp8(k, v, "e4m3")
    with pytest.raises(gaac.GaacError, match="'e4m3' or 'e5m2'"):
        gaac.compress(k8, v8, format="fp8")
    with pytest.raises(gaac.GaacError, match="FP8 bytes"):
        gaac.compress(k, v, format="e4m3")  # BF16 values given as FP8
    with pytest.raises(gaac.GaacError, match="scales belong to FP8"):
        gaac.compress(k, v, k_scales=ks, v_scales=vs)
    with pytest.raises(gaac.GaacError, match="finite and positive"):
        gaac.compress(k8, v8, format="e4m3", k_scales=[0.0], v_scales=[1.0])
    e5m2_table = gaac.calibrate(k8, v8, format="e5m2")
    with pytest.raises(gaac.GaacError, match="e5m2"):
        gaac.compress(k8, v8, e5m2_table, format="e4m3")
    with pytest.raises(gaac.GaacError, match="'per-tensor' or 'none'"):
        gaac.convert_to_fp8(k, v, "e4m3", "per-channel")
