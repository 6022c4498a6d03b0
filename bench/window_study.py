#!/usr/bin/env python3
"""Could a tile format do without 4-bit escapes? Groups of real KV under shifted 3-bit windows.

A GPU lane rebuilds a 4-bit group's exponents from an escape byte spread to four bytes a quad; that work is
done for every group, escaped or not, and is about half of a tile's rebuild (docs/performance.md, GPU decode
attention). A format whose groups instead pick one of a few 3-bit windows [b3 + s, b3 + s + 7] (s from a fixed
set, one tag value each) would need no escape bits for them, only a base chosen per group; groups that fit no
window would be raw (5 escape bytes). This counts, on the real caches scripts/bench_kv.sh writes and their
calibration tables, the share of groups in each mode today (docs/format.md, section 4: 3-bit at b3, 4-bit at
b4, raw) and, for every set of 3 or 4 shifts from -12 to +8 (0 among them), the share left raw and the codec's
bits per element and ratio (11.25 bits an element of a 3-bit group, tags included; +5 bits an element of a raw
group; three windows and raw fill today's 2-bit tag, four need a third bit: +0.125 bits an element).

  python3 bench/window_study.py [--kv-dir ~/.cache/gaac/kv] [--models smollm2,gemma3] [--best 3]
"""
import argparse
import itertools
import os

import numpy as np
import torch
from safetensors.numpy import load_file

import gaac


def exponents(tensor):
    """The exponent field of every BF16 element of a tensor of the dump: [tokens, kv_heads, head_dim]."""
    bits = gaac.to_torch(tensor).view(torch.int16).numpy().astype(np.int32) & 0xFFFF
    return (bits >> 7) & 0xFF


def key_groups(d):
    """Groups of a key tile (docs/format.md, section 4): one token, channels 32p + 2t + {0, 1, 8, 9, 16, 17, 24,
    25}; `d` [tokens, heads, channels] -> [groups, 8]."""
    channels = d.shape[2]
    index = np.array([[32 * p + 2 * t + o for o in (0, 1, 8, 9, 16, 17, 24, 25)]
                      for p in range(channels // 32) for t in range(4)])
    return d[:, :, index].reshape(-1, 8)


def value_groups(d):
    """Groups of a value tile: tokens 2t + {0, 1, 8, 9} of a block, channels 16p + g and 16p + 8 + g."""
    tokens, heads, channels = d.shape
    blocks = d.reshape(tokens // 16, 16, heads, channels)
    groups = []
    for t in range(4):
        rows = blocks[:, [2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9]]
        for p in range(channels // 16):
            for g in range(8):
                groups.append(rows[:, :, :, [16 * p + g, 16 * p + 8 + g]].transpose(0, 2, 1, 3).reshape(-1, 8))
    return np.concatenate(groups)


def offsets(layers, b3, b4, kind):
    """Every group's offsets from b3 and from b4, over all layers: two [groups, 8] arrays."""
    from3, from4 = [], []
    for layer, tensor in enumerate(layers):
        e = exponents(tensor)
        e = e[: e.shape[0] - e.shape[0] % 16]  # complete blocks only
        group = key_groups if kind == "k" else value_groups
        from3.append(group(e - b3[layer][None].astype(np.int32)))
        from4.append(group(e - b4[layer][None].astype(np.int32)))
    return np.concatenate(from3), np.concatenate(from4)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kv-dir", default=os.environ.get("GAAC_KV_DIR", os.path.expanduser("~/.cache/gaac/kv")))
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--best", type=int, default=3, help="window sets shown per size")
    args = ap.parse_args()
    for model in args.models.split(","):
        k, v = gaac.load_kv_dump(os.path.join(args.kv_dir, f"{model}-gpl3-2048.safetensors"))
        table = load_file(os.path.join(args.kv_dir, f"{model}-calibration.safetensors"))
        for kind, layers in (("k", k), ("v", v)):
            d3, d4 = offsets(layers, table[f"{kind}.b3"], table[f"{kind}.b4"], kind)
            low, high = d3.min(1), d3.max(1)
            three = (low >= 0) & (high <= 7)
            four = ~three & (d4.min(1) >= 0) & (d4.max(1) <= 15)
            raw = ~three & ~four
            bits = 11.25 + four.mean() + 5 * raw.mean()
            print(f"{model} {kind.upper()}: {len(d3)} groups; today 3-bit {100 * three.mean():.2f}%, 4-bit "
                  f"{100 * four.mean():.2f}%, raw {100 * raw.mean():.3f}%: {bits:.4f} bits/element, ratio {16 / bits:.4f}; "
                  f"spread ≤ 7 in {100 * ((high - low)[four] <= 7).mean():.1f}% of the 4-bit groups")
            for size in (3, 4):
                ranked = []
                for others in itertools.combinations([s for s in range(-12, 9) if s != 0], size - 1):
                    fits = np.zeros(len(d3), bool)
                    for s in (0, *others):
                        fits |= (low >= s) & (high <= s + 7)
                    ranked.append((1 - fits.mean(), (0, *others)))
                for left, shifts in sorted(ranked)[: args.best]:
                    bits = 11.25 + 0.125 * (size > 3) + 5 * left
                    print(f"  windows at b3 + {shifts}: raw {100 * left:.3f}%, {bits:.4f} bits/element, ratio {16 / bits:.4f}")


if __name__ == "__main__":
    main()
