#!/usr/bin/env python3
"""Cuts one layer out of a KV dump and its calibration table (docs/format.md sections 9 and 10), so the
GPU benchmark's real KV fits a small transfer: writes <out>/<name>-gpl3-2048.safetensors (layer L as
layer 0) and <out>/<name>-calibration.safetensors (one layer).

  python3 bench/gpu/cut_layer.py DUMP CALIBRATION LAYER OUTDIR NAME
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
    dump, calibration, layer, outdir, name = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
    os.makedirs(outdir, exist_ok=True)
    header, body = read(dump)
    blobs = {}
    for kind in ("k", "v"):
        t = header[f"{kind}.{layer}"]
        a, b = t["data_offsets"]
        blobs[f"{kind}.0"] = (t["dtype"], t["shape"], body[a:b])
    meta = dict(header.get("__metadata__", {}))
    meta["cut_from_layer"] = str(layer)
    write(os.path.join(outdir, f"{name}-gpl3-2048.safetensors"), meta, blobs)

    header, body = read(calibration)
    meta = dict(header["__metadata__"])
    layers, kv, hd = int(meta["layers"]), int(meta["kv_heads"]), int(meta["head_dim"])
    blobs = {}
    for t in ("k.b3", "k.b4", "v.b3", "v.b4"):
        a, _ = header[t]["data_offsets"]
        per = kv * hd
        blobs[t] = ("U8", [1, kv, hd], body[a + layer * per:a + (layer + 1) * per])
    for kind in ("k", "v"):
        meta[f"{kind}.escape_capacity"] = json.dumps([json.loads(meta[f"{kind}.escape_capacity"])[layer]])
    meta["layers"] = "1"
    meta["info.cut_from_layer"] = str(layer)
    write(os.path.join(outdir, f"{name}-calibration.safetensors"), meta, blobs)


if __name__ == "__main__":
    main()
