#!/usr/bin/env python3
"""Cuts layers out of a KV dump and its calibration table (docs/format.md sections 9 and 10), so the
GPU benchmark's real KV fits a small transfer: writes <out>/<name>-gpl3-2048.safetensors (the given
layers as layers 0, 1, ...) and <out>/<name>-calibration.safetensors (the same layers).

  python3 bench/gpu/cut_layer.py DUMP CALIBRATION LAYER[,LAYER...] OUTDIR NAME
"""
import json
import os
import struct
import sys


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def write(path, header, blobs):
    offset, entries = 0, {}
    for name, (dtype, shape, blob) in blobs.items():
        entries[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
    entries["__metadata__"] = header
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(b for _, _, b in blobs.values()))


def main():
    dump, calibration, outdir, name = sys.argv[1], sys.argv[2], sys.argv[4], sys.argv[5]
    layers = [int(x) for x in sys.argv[3].split(",")]
    os.makedirs(outdir, exist_ok=True)
    header, body = read(dump)
    blobs = {}
    for i, layer in enumerate(layers):
        for kind in ("k", "v"):
            t = header[f"{kind}.{layer}"]
            a, b = t["data_offsets"]
            blobs[f"{kind}.{i}"] = (t["dtype"], t["shape"], body[a:b])
    meta = dict(header.get("__metadata__", {}))
    meta["cut_from_layers"] = ",".join(map(str, layers))
    write(os.path.join(outdir, f"{name}-gpl3-2048.safetensors"), meta, blobs)

    header, body = read(calibration)
    meta = dict(header["__metadata__"])
    kv, hd = int(meta["kv_heads"]), int(meta["head_dim"])
    per = kv * hd
    blobs = {}
    for t in ("k.b3", "k.b4", "v.b3", "v.b4"):
        a, _ = header[t]["data_offsets"]
        blobs[t] = ("U8", [len(layers), kv, hd], b"".join(body[a + l * per:a + (l + 1) * per] for l in layers))
    for kind in ("k", "v"):
        caps = json.loads(meta[f"{kind}.escape_capacity"])
        meta[f"{kind}.escape_capacity"] = json.dumps([caps[l] for l in layers])
    meta["layers"] = str(len(layers))
    meta["info.cut_from_layers"] = ",".join(map(str, layers))
    write(os.path.join(outdir, f"{name}-calibration.safetensors"), meta, blobs)


if __name__ == "__main__":
    main()
