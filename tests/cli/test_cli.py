#!/usr/bin/env python3
"""End-to-end tests of the gaac command-line tool: exit codes, stdout/stderr discipline, JSON keys,
bit-exact round trips and clear errors on bad input. Usage: test_cli.py PATH/TO/gaac WORKDIR.
Standard library only; prints "N passed, N failed" and exits non-zero on any failure."""

import json
import os
import shutil
import struct
import subprocess
import sys

GAAC = sys.argv[1]
WORK = sys.argv[2]
passed = 0
failed = 0


def run(*args):
    return subprocess.run([GAAC, *args], capture_output=True, text=True)


def check(name, condition, detail=""):
    global passed, failed
    if condition:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {name}: {detail}", file=sys.stderr)


def path(name):
    return os.path.join(WORK, name)


def write_safetensors(file, tensors):
    """tensors: {name: (dtype, shape, raw bytes)}, written as the safetensors format specifies."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(file, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    kv, calib_kv = path("kv.safetensors"), path("calib-kv.safetensors")

    r = run("synth", "--layers", "3", "--kv-heads", "2", "--head-dim", "256", "--tokens", "203", "-o", kv)
    check("synth exit", r.returncode == 0, r.stderr)
    r = run("synth", "--layers", "3", "--kv-heads", "2", "--head-dim", "256", "--tokens", "300", "--seed", "9",
            "-o", calib_kv)
    check("synth 2 exit", r.returncode == 0, r.stderr)

    calib = path("calib.safetensors")
    r = run("calibrate", calib_kv, kv, "-o", calib)
    check("calibrate exit", r.returncode == 0, r.stderr)
    check("calibrate reports capacities", "escape-slot capacity" in r.stdout, r.stdout)
    check("no progress bar when stderr is not a terminal", r.stderr == "", r.stderr)

    r = run("stats", kv, "--calib", calib, "--json")
    check("stats exit", r.returncode == 0, r.stderr)
    stats = json.loads(r.stdout)
    for key in ("ratio", "resident_ratio", "bits_per_element", "exponent_entropy_bits", "modes", "layers"):
        check(f"stats key {key}", key in stats, list(stats))
    modes = stats["modes"]
    check("mode fractions sum to 1", abs(modes["3bit"] + modes["4bit"] + modes["raw"] - 1) < 1e-9, modes)
    check("three layers", len(stats["layers"]) == 3, len(stats["layers"]))
    check("ratio plausible", 1.3 < stats["ratio"] < 1.43, stats["ratio"])
    check("resident below codec ratio", stats["resident_ratio"] <= stats["ratio"], stats)
    check("bits per element consistent", abs(stats["bits_per_element"] - 16 / stats["ratio"]) < 1e-9, stats)

    r = run("stats", kv)
    check("stats table (self-calibrated)", r.returncode == 0 and "total" in r.stdout, r.stderr)

    packed, restored = path("kv.gaac"), path("restored.safetensors")
    r = run("compress", kv, "--calib", calib, "-o", packed)
    check("compress exit", r.returncode == 0, r.stderr)
    r = run("decompress", packed, "-o", restored)
    check("decompress exit", r.returncode == 0, r.stderr)
    check("restored file identical", open(kv, "rb").read() == open(restored, "rb").read())
    r = run("verify", kv, "--calib", calib)
    check("verify exit", r.returncode == 0 and "verify OK" in r.stdout, r.stdout + r.stderr)

    data = bytearray(open(packed, "rb").read())
    data[len(data) // 2] ^= 0x10
    corrupt = path("corrupt.gaac")
    open(corrupt, "wb").write(data)
    r = run("decompress", corrupt, "-o", path("never.safetensors"))
    check("corrupt snapshot rejected", r.returncode == 1 and "checksum" in r.stderr, r.stderr)
    check("nothing written for a corrupt snapshot", not os.path.exists(path("never.safetensors")))
    open(path("short.gaac"), "wb").write(bytes(data[:100]))
    r = run("decompress", path("short.gaac"), "-o", path("never.safetensors"))
    check("truncated snapshot rejected", r.returncode == 1 and "error" in r.stderr, r.stderr)

    f32 = path("f32.safetensors")
    write_safetensors(f32, {"k.0": ("F32", [1, 1, 64], bytes(256)), "v.0": ("BF16", [1, 1, 64], bytes(128))})
    r = run("stats", f32)
    check("non-BF16 rejected naming the tensor", r.returncode == 1 and "k.0" in r.stderr and "F32" in r.stderr,
          r.stderr)
    odd = path("odd.safetensors")
    write_safetensors(odd, {"k.0": ("BF16", [1, 1, 96], bytes(192)), "v.0": ("BF16", [1, 1, 96], bytes(192))})
    r = run("verify", odd)
    check("head_dim 96 rejected", r.returncode == 1 and "96" in r.stderr, r.stderr)

    other = path("other.safetensors")
    run("synth", "--layers", "2", "--head-dim", "64", "-o", other)
    r = run("stats", other, "--calib", calib)
    check("mismatched calibration rejected", r.returncode == 1 and "calibration" in r.stderr, r.stderr)

    r = run("compress", kv)
    check("missing -o is a usage error", r.returncode not in (0, 1), r.returncode)
    r = run("--help")
    check("--help lists the subcommands", r.returncode == 0 and all(
        c in r.stdout for c in ("calibrate", "stats", "compress", "decompress", "verify")), r.stdout)

    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
