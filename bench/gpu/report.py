#!/usr/bin/env python3
"""Markdown tables for docs/performance.md from a bench_decode.py JSON file.

  python3 bench/gpu/report.py bench/gpu/results/h200-2026-12-01-v8.json
"""
import json
import sys

BF16 = ["bf16_twin", "sdpa_cudnn", "sdpa_flash", "flashinfer", "flashinfer_tc"]
NAMES = {"gaac": "GAAC fused", "bf16_twin": "BF16 twin", "decompress_first": "decompress-first (decompress + twin)",
         "decompress_only": "  decompression alone", "sdpa_cudnn": "PyTorch SDPA, cuDNN",
         "sdpa_flash": "PyTorch SDPA, flash (FA2)", "flashinfer": "FlashInfer paged decode",
         "flashinfer_tc": "FlashInfer paged decode, tensor cores", "bf16_twin_stages2": "BF16 twin, 2 stages",
         "bf16_twin_stages3": "BF16 twin, 3 stages", "bf16_twin_stages4": "BF16 twin, 4 stages"}


def case(data, shape, context, batch):
    for c in data["cases"]:
        if (c["shape"], c["context"], c["batch"]) == (shape, context, batch):
            return c
    return None


def one_case(data, shape, context, batch):
    c = case(data, shape, context, batch)
    bw = data["meta"]["copy_tbps"]
    m = c["methods"]
    print(f"\n{shape}, context {context}, batch {batch}: {c['cache']['compressed_tiles']} slots, "
          f"{c['cache']['raw_tiles']} raw tiles, units of {c['cache']['unit_bytes']} B; GAAC reads "
          f"{c['cache']['gaac_bytes'] / 1e6:.1f} MB, BF16 kernels {c['bf16_bytes'] / 1e6:.1f} MB; "
          f"GAAC bit-identical to the twin: {c['bit_exact_vs_twin']}\n")
    print("| kernel | µs | effective TB/s (BF16 bytes / time) | TB/s read | % of memory floor | its time / GAAC's |")
    print("|---|---|---|---|---|---|")
    for n in ["gaac"] + BF16 + ["decompress_first", "decompress_only"]:
        x = m.get(n)
        if not x or "us" not in x:
            continue
        read = x.get("bytes", c["bf16_bytes"])
        floor = read / (bw * 1e12) * 1e6
        sp = "–" if n in ("gaac", "decompress_only") else f"{x['us'] / m['gaac']['us']:.2f}×"
        print(f"| {NAMES[n]} | {x['us']:.1f} | {x['effective_tbps']:.2f} | {read / x['us'] / 1e6:.2f} | "
              f"{100 * floor / x['us']:.0f}% | {sp} |")


def breakdown(data, shape, context, batch):
    m = case(data, shape, context, batch)["methods"]
    u = lambda n: m[n]["us"]
    print("\n| component (µs) | BF16 twin | decompress-first | GAAC fused |")
    print("|---|---|---|---|")
    print(f"| KV loading (load-only variant) | {u('bf16_twin_load_only'):.1f} | "
          f"{u('bf16_twin_load_only'):.1f} | {u('gaac_load_only'):.1f} |")
    print(f"| exponent decoding | – | {u('decompress_only'):.1f} (separate kernel) | "
          f"+{u('gaac_no_math') - u('gaac_load_only'):.1f} (no-math variant − load-only) |")
    print(f"| computation | +{u('bf16_twin') - u('bf16_twin_load_only'):.1f} | "
          f"+{u('bf16_twin') - u('bf16_twin_load_only'):.1f} | +{u('gaac') - u('gaac_no_math'):.1f} "
          f"(full − no-math; products on stored words without decoding: "
          f"+{u('gaac_no_decode') - u('gaac_load_only'):.1f}) |")
    print(f"| measured total | {u('bf16_twin'):.1f} | {u('decompress_first'):.1f} | {u('gaac'):.1f} |")


def summary(data):
    print("\n| shape | context | batch | GAAC µs | twin µs | cuDNN µs | FA2 µs | FlashInfer µs | FlashInfer TC µs | "
          "best BF16 | GAAC / best BF16 | GAAC / twin | bit-exact |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in data["cases"]:
        m = c.get("methods", {})
        u = lambda n: f"{m[n]['us']:.1f}" if "us" in m.get(n, {}) else "–"
        best = c.get("best_bf16", "–")
        twin = m["bf16_twin"]["us"] / m["gaac"]["us"] if "us" in m.get("bf16_twin", {}) else float("nan")
        print(f"| {c['shape']} | {c['context'] // 1024}K | {c['batch']} | {u('gaac')} | {u('bf16_twin')} | "
              f"{u('sdpa_cudnn')} | {u('sdpa_flash')} | {u('flashinfer')} | {u('flashinfer_tc')} | "
              f"{NAMES.get(best, best).replace('PyTorch SDPA, ', '')} | {c.get('speedup_vs_best_bf16', '–')}× | "
              f"{twin:.2f}× | {c.get('bit_exact_vs_twin')} |")


def stages(data, shape, context, batch):
    m = case(data, shape, context, batch)["methods"]
    print("\n| stages per warp | GAAC µs (CTAs/SM) | twin µs (CTAs/SM) |")
    print("|---|---|---|")
    for s in (2, 3, 4):
        g, t = m[f"gaac_stages{s}"], m[f"bf16_twin_stages{s}"]
        print(f"| {s} | {g['us']:.1f} ({g['plan']['ctas_per_sm']}) | {t['us']:.1f} ({t['plan']['ctas_per_sm']}) |")


def main():
    data = json.load(open(sys.argv[1]))
    print(f"device {data['meta']['device']}, torch {data['meta']['torch']}, FlashInfer {data['meta']['flashinfer']}, "
          f"copy bandwidth {data['meta']['copy_tbps']} TB/s")
    for shape in ("llama", "llama_realkv"):
        one_case(data, shape, 65536, 1)
    breakdown(data, "llama", 65536, 1)
    stages(data, "llama", 65536, 1)
    summary(data)


if __name__ == "__main__":
    main()
