#!/usr/bin/env python3
"""Prints the paper's Table 1 and Table 3 rows from `gaac stats --json` outputs.

  paper_tables.py table1 MODEL STATS.json [--global-layers 5,11,17]
      exponent entropy, ratio and mode split for K, V and the total (and sliding vs global layers)
  paper_tables.py table3 NAME CROSS.json ORACLE.json
      calibration transfer: mode split and ratio with windows from another text vs from the text itself
  paper_tables.py layers MODEL STATS.json
      Table 1 per layer: K and V entropy, ratio and mode split of every layer
  paper_tables.py capacity MODEL STATS.json
      the escape-slot capacities calibration chose (range over layers, K and V) and the resident figures
  paper_tables.py table7 MODEL CONVERSION STATS.json
      an FP8 dump's row of Table 7: format, ratio over FP8 and over BF16 (packed and resident), mode split
"""
import json
import sys


def modes(s):
    m = s["modes"]
    return f"{100 * m['3bit']:.1f}% | {100 * m['4bit']:.1f}% | {100 * m['raw']:.2f}%"


def merge(layers, kinds):
    """Figures of several layers' tensors together, from their byte counts and per-tile mode fractions
    (every tile of a model has the same number of groups, so tiles weight the fractions)."""
    bf16 = codec = tiles = 0
    groups = [0.0, 0.0, 0.0]
    for layer in layers:
        for k in kinds:
            s = layer[k]
            bf16 += s["bf16_bytes"]
            codec += s["codec_bytes"]
            tiles += s["tiles"]
            for i, key in enumerate(("3bit", "4bit", "raw")):
                groups[i] += s["modes"][key] * s["tiles"]
    return {"ratio": bf16 / codec, "modes": {k: g / max(tiles, 1) for k, g in zip(("3bit", "4bit", "raw"), groups)}}


def table1(model, path, global_layers):
    s = json.load(open(path))
    print(f"| {model} | total | {s['exponent_entropy_bits']:.2f} | {s['ratio']:.3f} | {s['resident_ratio']:.3f} | {modes(s)} |")
    for k in ("k", "v"):
        t = s[k]
        print(f"| {model} | {k.upper()} | {t['exponent_entropy_bits']:.2f} | {t['ratio']:.3f} | {t['resident_ratio']:.3f} | {modes(t)} |")
    if global_layers:
        for name, pick in (("sliding layers", lambda i: i not in global_layers), ("global layers", lambda i: i in global_layers)):
            ls = [l for l in s["layers"] if pick(l["layer"])]
            m = merge(ls, ("k", "v"))
            print(f"| {model} | {name} | – | {m['ratio']:.3f} | – | {modes(m)} |")


def table3(name, cross, oracle):
    c, o = json.load(open(cross)), json.load(open(oracle))
    cm, om = c["modes"], o["modes"]
    print(f"| {name} | {100 * cm['3bit']:.1f} | {100 * om['3bit']:.1f} | {100 * cm['4bit']:.1f} | {100 * om['4bit']:.1f} | "
          f"{100 * cm['raw']:.2f} | {100 * om['raw']:.2f} | {c['ratio']:.3f} | {o['ratio']:.3f} |")


def layers(model, path):
    s = json.load(open(path))
    for layer in s["layers"]:
        cells = []
        for k in ("k", "v"):
            t = layer[k]
            m = t["modes"]
            cells.append(f"{t['exponent_entropy_bits']:.2f} | {t['ratio']:.3f} | {100 * m['3bit']:.1f} / {100 * m['4bit']:.1f} / {100 * m['raw']:.2f}")
        print(f"| {model} | {layer['layer']} | {cells[0]} | {cells[1]} |")


def capacity(model, path):
    s = json.load(open(path))
    for k in ("k", "v"):
        caps = [layer[k]["escape_capacity_bytes"] for layer in s["layers"]]
        fallback = sum(layer[k]["fallback_tiles"] for layer in s["layers"]) / max(1, sum(layer[k]["tiles"] for layer in s["layers"]))
        print(f"| {model} | {k.upper()} | {min(caps)}–{max(caps)} | {100 * fallback:.2f}% | "
              f"{16 / s[k]['resident_ratio']:.3f} | {s[k]['resident_ratio']:.3f} |")
    print(f"| {model} | total | | | {16 / s['resident_ratio']:.3f} | {s['resident_ratio']:.3f} |")


def table7(model, conversion, path):
    s = json.load(open(path))
    m = s["modes"]
    print(f"| {model} | {s['element_format'].upper()} | {conversion} | {s['exponent_entropy_bits']:.2f} | {s['ratio']:.3f} | "
          f"{s['ratio_vs_bf16']:.3f} | {s['resident_ratio']:.3f} | {s['resident_ratio_vs_bf16']:.3f} | "
          f"{100 * m['2bit']:.1f} / {100 * m['3bit']:.1f} / {100 * m['raw']:.1f}% |")


if __name__ == "__main__":
    if sys.argv[1] == "table1":
        gl = set()
        if len(sys.argv) > 5 and sys.argv[4] == "--global-layers":
            gl = {int(x) for x in sys.argv[5].split(",")}
        table1(sys.argv[2], sys.argv[3], gl)
    elif sys.argv[1] == "table3":
        table3(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "layers":
        layers(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "capacity":
        capacity(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "table7":
        table7(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(__doc__)
