#!/usr/bin/env python3
"""Where calibration looks matters at long context: a model's K/V for one long prompt, calibrated (a) on its
first N tokens and (b) on N tokens spread over the whole prompt (every k-th 16-token block), then the whole
prompt stored in a gaac.KvCache with each table: raw tiles, resident bytes and ratio. CPU only
(transformers + the GGUF file).

  python3 bench/calibration_positions.py --model ~/.cache/gaac/models/SmolLM2-135M-Instruct.Q4_1.gguf \\
      --tokens 8192 --calibration-tokens 1024
"""
import argparse
import json
import pathlib

import torch
from transformers import AutoModelForCausalLM, DynamicCache

import gaac
from gaac.transformers import cache_argument, calibrate_kv

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a GGUF file transformers can load")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--calibration-tokens", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0, help="random token ids (0: the calibration text repeated, "
                    "tokenized by the model's tokenizer)")
    args = ap.parse_args()
    path = pathlib.Path(args.model)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.bfloat16)
    if args.seed:
        ids = torch.randint(100, 20000, (1, args.tokens), generator=torch.Generator().manual_seed(args.seed))
    else:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        text = tok((ROOT / "data" / "calibration_text.txt").read_text(), return_tensors="pt").input_ids[0]
        ids = text.repeat(args.tokens // text.numel() + 1)[:args.tokens][None]
    cache = DynamicCache()  # every layer whole
    with torch.no_grad():
        model(input_ids=ids, use_cache=True, logits_to_keep=1, **{cache_argument(model): cache})
    keys, values = [l.keys for l in cache.layers], [l.values for l in cache.layers]
    n = args.calibration_tokens
    tables = {
        "first": calibrate_kv([a[:, :, :n] for a in keys], [a[:, :, :n] for a in values]),
        "spread": calibrate_kv(keys, values, sample_tokens=n),
    }
    k = [a[0].transpose(0, 1) for a in keys]  # [tokens, kv_heads, dim] views, as KvCache.append reads them
    v = [a[0].transpose(0, 1) for a in values]
    layers, kv_heads, head_dim = len(k), k[0].shape[1], k[0].shape[2]
    out = {"model": path.name, "tokens": args.tokens, "calibration_tokens": n}
    for name, table in tables.items():
        budget = gaac.KvCache.worst_case_budget(layers, kv_heads, head_dim, args.tokens, 1, table)
        kv = gaac.KvCache(layers, kv_heads, head_dim, budget, table)
        s = kv.add_sequence()
        kv.append(s, k, v)
        u = kv.usage()
        tiles = u["compressed_tiles"] + u["raw_tiles"]
        out[name] = {"raw_share": u["raw_tiles"] / tiles, "resident_bytes": u["resident_bytes"],
                     "ratio": u["bf16_bytes"] / u["resident_bytes"]}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
