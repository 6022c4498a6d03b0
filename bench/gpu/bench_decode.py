#!/usr/bin/env python3
"""Decode attention on the GPU, in one process: gaac's fused GAAC kernel, its BF16 twin, decompress-first,
PyTorch scaled_dot_product_attention (cuDNN and flash backends) and FlashInfer's paged decode (with and
without tensor cores), on the same values. Every method is validated against an fp32 reference before it
is timed; GAAC is also checked bit for bit against the twin run with the same split.

Timing: for each method, 30 calls are queued behind a 2 ms sleep kernel (so the host is ahead and launch
overhead does not count), rotating over enough copies of the data that the L2 never serves a call from the
previous one; the time per call is the median over 7 such batches. Effective TB/s = BF16 K+V bytes / time.

  python3 bench/gpu/bench_decode.py --lib build/bench/gpu/libgaac_gpu_bench.so --out bench.json \\
      [--kv-dir DIR] [--shapes llama,...] [--quick | --cases 65536:1,...] [--quick-variants] [--no-flashinfer]
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

# name: (q heads, kv heads, head_dim, KV source)
SHAPES = {
    "llama": (32, 8, 128, "synthetic"),      # Llama-3.1-8B / Qwen3-8B attention shape
    "llama_realkv": (32, 8, 128, "smollm2x6"),  # the same shape, heads paired from SmolLM2's real KV
    "gemma3": (4, 1, 256, "gemma3"),         # Gemma 3 270M, real KV
    "smollm2": (9, 3, 64, "smollm2"),        # SmolLM2-135M, real KV
    "gqa16": (64, 4, 128, "synthetic"),      # 16 query heads per KV head (Qwen3-235B-A22B's attention shape)
    "mha": (8, 8, 128, "synthetic"),         # one query head per KV head
    "d64_kv2": (16, 2, 64, "synthetic"),     # few KV heads of width 64, 8 query heads each
}
REAL_LAYER = {"gemma3": 0, "smollm2": 0, "smollm2x6": 0}  # files cut by cut_layer.py: layers 8, 12, 10..15
CASES = [(4096, 1), (16384, 1), (32768, 1), (65536, 1), (131072, 1), (65536, 2), (65536, 4), (32768, 8)]
QUICK_CASES = [(4096, 1), (65536, 1), (131072, 1), (65536, 4), (32768, 8)]
L2_ROTATION_BYTES = 256 << 20


class Gaac:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        L = self.lib
        L.gaac_bench_error.restype = ctypes.c_char_p
        L.gaac_bench_create.restype = ctypes.c_void_p
        L.gaac_bench_create.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                                        ctypes.c_int, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_int]
        L.gaac_bench_describe.restype = ctypes.c_char_p
        L.gaac_bench_describe.argtypes = [ctypes.c_void_p]
        L.gaac_bench_export.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        L.gaac_bench_run.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                     ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.POINTER(ctypes.c_int)]
        L.gaac_bench_plan.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        L.gaac_bench_free.argtypes = [ctypes.c_void_p]
        if hasattr(L, "gaac_bench_set_heads_per_cta"):  # libraries of earlier kernel versions lack it
            L.gaac_bench_set_heads_per_cta.argtypes = [ctypes.c_void_p, ctypes.c_int]

    def check(self, status):
        if status != 0:
            raise RuntimeError(self.lib.gaac_bench_error().decode())


def kernel_sleep():
    torch.cuda._sleep(4_000_000)  # ~2 ms at 1.98 GHz: the host queues the calls meanwhile


def time_calls(fn, copies, calls=30, batches=7):
    per_call = []
    for _ in range(batches):
        torch.cuda.synchronize()
        kernel_sleep()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(calls):
            fn(i % copies)
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) * 1000.0 / calls)
    # The sleep is before `start`; what remains is back-to-back calls.
    return statistics.median(per_call), min(per_call), max(per_call)


def copy_bandwidth():
    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        y.copy_(x)
    end.record()
    end.synchronize()
    sec = start.elapsed_time(end) / 1000 / 10
    del x, y
    return 2 * (2 << 30) / sec / 1e12


def reference(q, k, v, scale):
    """fp32 attention of one query token per sequence: q [B, H, d], k/v [B, L, KVH, d] -> [B, H, d]."""
    B, H, d = q.shape
    kvh = k.shape[2]
    g = H // kvh
    out = torch.empty(B, H, d, dtype=torch.float32, device=q.device)
    for b in range(B):
        kb = k[b].float().permute(1, 0, 2)  # [KVH, L, d]
        vb = v[b].float().permute(1, 0, 2)
        qb = q[b].float().view(kvh, g, d)
        s = torch.einsum("hgd,hld->hgl", qb, kb) * scale
        p = torch.softmax(s, dim=-1)
        out[b] = torch.einsum("hgl,hld->hgd", p, vb).reshape(H, d)
    return out


def rel_error(x, ref):
    x = x.float()
    if not torch.isfinite(x).all():
        return float("inf")
    return (torch.linalg.vector_norm(x - ref) / torch.linalg.vector_norm(ref)).item()


def run_case(g, shape_name, context, batch, args, flashinfer, results, log):
    Hq, KVH, d, source = SHAPES[shape_name]
    bf16_bytes = batch * context * KVH * d * 2 * 2
    copies = max(1, min(16, math.ceil(L2_ROTATION_BYTES / bf16_bytes)))
    if source == "synthetic":
        src, layer, calib = b"synthetic", 0, b""
    else:
        src = os.path.join(args.kv_dir, f"{source}-gpl3-2048.safetensors").encode()
        layer = REAL_LAYER[source]
        calib = os.path.join(args.kv_dir, f"{source}-calibration.safetensors").encode()
    t0 = time.time()
    h = g.lib.gaac_bench_create(batch, context, KVH, d, src, layer, calib, 7, 0, copies)
    if not h:
        raise RuntimeError(g.lib.gaac_bench_error().decode())
    info = json.loads(g.lib.gaac_bench_describe(h).decode())
    k_host = torch.empty(batch, context, KVH, d, dtype=torch.int16)
    v_host = torch.empty_like(k_host)
    g.check(g.lib.gaac_bench_export(h, k_host.data_ptr(), v_host.data_ptr()))
    k = k_host.view(torch.bfloat16).cuda()
    v = v_host.view(torch.bfloat16).cuda()
    del k_host, v_host
    torch.manual_seed(context + batch)
    q = torch.randn(batch, Hq, d, device="cuda").to(torch.bfloat16)
    scale = 1.0 / math.sqrt(d)
    ref = reference(q, k, v, scale)
    out = torch.empty_like(q)
    case = {"shape": shape_name, "q_heads": Hq, "kv_heads": KVH, "head_dim": d, "context": context, "batch": batch,
            "source": source, "copies": copies, "bf16_bytes": bf16_bytes, "cache": info, "build_s": round(time.time() - t0, 2)}
    methods = {}

    def gaac_fn(path, work=0, stages=0, bps=0, warps=0):
        used = ctypes.c_int(0)

        def fn(i):
            g.check(g.lib.gaac_bench_run(h, i, path, work, stages, warps, bps, Hq, q.data_ptr(), out.data_ptr(), None,
                                         ctypes.byref(used)))
        fn.used = used
        return fn

    def measure(name, fn, physical_bytes=None, validate=True, extra=None):
        try:
            if callable(extra):  # the plan, asked for inside the try: a variant that cannot run is recorded
                extra = extra()
            out.fill_(float("nan"))
            fn(0)
            torch.cuda.synchronize()
            err = rel_error(out, ref) if validate else None
            if validate and not err < 2e-2:
                methods[name] = {"error": f"validation failed: relative error {err}"}
                log(f"  {name}: VALIDATION FAILED ({err})")
                return
            med, lo, hi = time_calls(fn, copies)
            m = {"us": round(med, 2), "us_min": round(lo, 2), "us_max": round(hi, 2),
                 "effective_tbps": round(bf16_bytes / med / 1e6, 3)}
            if err is not None:
                m["rel_error"] = float(f"{err:.3g}")
            if physical_bytes:
                m["bytes"] = physical_bytes
                m["tbps"] = round(physical_bytes / med / 1e6, 3)
            if extra:
                m.update(extra)
            methods[name] = m
            log(f"  {name:28s} {med:9.2f} us  {m['effective_tbps']:6.3f} TB/s eff" +
                (f"  {m['tbps']:6.3f} TB/s read" if physical_bytes else "") + (f"  err {err:.2e}" if err is not None else ""))
        except Exception as e:  # a failing peer must not stop the run
            methods[name] = {"error": str(e)[:300]}
            log(f"  {name}: ERROR {str(e)[:200]}")

    def plan(path, work=0, stages=0, warps=0):
        buf = ctypes.create_string_buffer(256)
        g.check(g.lib.gaac_bench_plan(h, path, work, stages, warps, Hq, buf, 256))
        return json.loads(buf.value.decode())

    gaac_bytes, twin_bytes = info["gaac_bytes"], info["bf16_bytes"]
    measure("gaac", gaac_fn(0), gaac_bytes, extra=lambda: {"plan": plan(0)})
    measure("bf16_twin", gaac_fn(1), twin_bytes, extra=lambda: {"plan": plan(1)})
    # Bit-exactness: the twin with GAAC's split.
    try:
        fg = gaac_fn(0)
        fg(0)
        torch.cuda.synchronize()
        a = out.clone()
        gaac_split = fg.used.value
        gaac_fn(1, bps=gaac_split)(0)
        torch.cuda.synchronize()
        case["bit_exact_vs_twin"] = bool(torch.equal(a.view(torch.int16), out.view(torch.int16)))
        case["bit_exact_differing"] = int((a.view(torch.int16) != out.view(torch.int16)).sum().item())
    except Exception as e:
        case["bit_exact_vs_twin"] = f"error: {e}"
    measure("decompress_first", gaac_fn(2), gaac_bytes + 2 * twin_bytes)
    measure("decompress_only", gaac_fn(3), gaac_bytes + twin_bytes, validate=False)
    if shape_name == "llama" and not args.quick_variants:
        for stages in (2, 3, 4):
            # The stage sweep is of CTAs of 4 warps (the default CTA of 16 has one setting).
            measure(f"gaac_stages{stages}", gaac_fn(0, stages=stages, warps=4), gaac_bytes,
                    extra=lambda stages=stages: {"plan": plan(0, 0, stages, 4)})
            measure(f"bf16_twin_stages{stages}", gaac_fn(1, stages=stages, warps=4), twin_bytes,
                    extra=lambda stages=stages: {"plan": plan(1, 0, stages, 4)})
    # CTAs of 4, 8 and 16 warps beside the plan's own choice (the twin's best counts as a BF16 peer; a size
    # the shape cannot take is recorded as an error).
    for warps in (4, 8, 16):
        if plan(0)["warps"] != warps:
            measure(f"gaac_warps{warps}", gaac_fn(0, warps=warps), gaac_bytes, extra=lambda warps=warps: {"plan": plan(0, 0, 0, warps)})
        if plan(1)["warps"] != warps:
            measure(f"bf16_twin_warps{warps}", gaac_fn(1, warps=warps), twin_bytes, extra=lambda warps=warps: {"plan": plan(1, 0, 0, warps)})
    # Groups of 9-16 query heads per KV head also in CTAs of 8 heads (two CTAs a KV head, the 8-head instance).
    if Hq // KVH > 8 and hasattr(g.lib, "gaac_bench_set_heads_per_cta"):
        g.check(g.lib.gaac_bench_set_heads_per_cta(h, 8))
        measure("gaac_heads8", gaac_fn(0), gaac_bytes, extra=lambda: {"plan": plan(0)})
        measure("bf16_twin_heads8", gaac_fn(1), twin_bytes, extra=lambda: {"plan": plan(1)})
        g.check(g.lib.gaac_bench_set_heads_per_cta(h, 0))
    if shape_name == "llama" and not args.quick_variants:
        for work, wname in ((1, "no_math"), (2, "no_decode"), (3, "load_only")):
            measure(f"gaac_{wname}", gaac_fn(0, work=work), gaac_bytes, validate=False)
            if work != 2:
                measure(f"bf16_twin_{wname}", gaac_fn(1, work=work), twin_bytes, validate=False)

    # PyTorch SDPA: q [B, H, 1, d], K/V [B, KVH, L, d].
    k4 = [k.permute(0, 2, 1, 3).contiguous()]
    v4 = [v.permute(0, 2, 1, 3).contiguous()]
    for _ in range(copies - 1):
        k4.append(k4[0].clone())
        v4.append(v4[0].clone())
    q4 = q.unsqueeze(2)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
        def sdpa(i, backend=backend):
            with sdpa_kernel(backend):
                out.copy_(F.scaled_dot_product_attention(q4, k4[i], v4[i], enable_gqa=True).squeeze(2))
        # The copy into `out` is part of the call; a [B, H, d] copy is negligible next to the KV read.
        measure(name, sdpa, bf16_bytes)
    del k4, v4

    if flashinfer is not None:
        pages = context // 16
        kv_cache = [torch.stack((k.reshape(batch * pages, 16, KVH, d), v.reshape(batch * pages, 16, KVH, d)), dim=1)]
        for _ in range(copies - 1):
            kv_cache.append(kv_cache[0].clone())
        indptr = torch.arange(0, batch + 1, dtype=torch.int32, device="cuda") * pages
        indices = torch.arange(0, batch * pages, dtype=torch.int32, device="cuda")
        last = torch.full((batch,), 16, dtype=torch.int32, device="cuda")
        workspace = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        for tc in ((True, False) if d == 128 else (True,)):
            name = "flashinfer_tc" if tc else "flashinfer"
            try:
                w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=tc)
                w.plan(indptr, indices, last, Hq, KVH, d, 16, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)

                def fi(i, w=w):
                    out.copy_(w.run(q, kv_cache[i]))
                measure(name, fi, bf16_bytes)
            except Exception as e:  # a build failure's cause is at the end of its message
                methods[name] = {"error": str(e)[:200] + " ... " + str(e)[-1500:]}
                log(f"  {name}: ERROR {str(e)[:100]} ... {str(e)[-1500:]}")
        del kv_cache
    g.lib.gaac_bench_free(h)
    del k, v
    torch.cuda.empty_cache()

    bf16_names = [n for n in ("bf16_twin", "sdpa_cudnn", "sdpa_flash", "flashinfer", "flashinfer_tc")
                  if "us" in methods.get(n, {})]
    bf16_names += [n for n in methods if n.startswith(("bf16_twin_stages", "bf16_twin_warps", "bf16_twin_heads")) and "us" in methods[n]]
    if bf16_names and "us" in methods.get("gaac", {}):
        best = min(bf16_names, key=lambda n: methods[n]["us"])
        case["best_bf16"] = best
        case["speedup_vs_best_bf16"] = round(methods[best]["us"] / methods["gaac"]["us"], 3)
        for n in bf16_names + ["decompress_first"]:
            if "us" in methods.get(n, {}):
                methods[n]["gaac_speedup"] = round(methods[n]["us"] / methods["gaac"]["us"], 3)
    case["methods"] = methods
    results.append(case)


def profile(args):
    """One launch of the fused GAAC kernel and one of the twin on a case, for a profiler to catch."""
    shape, context, batch = args.profile.split(":")
    context, batch = int(context), int(batch)
    Hq, KVH, d, source = SHAPES[shape]
    g = Gaac(args.lib)
    if source == "synthetic":
        src, calib = b"synthetic", b""
    else:
        src = os.path.join(args.kv_dir, f"{source}-gpl3-2048.safetensors").encode()
        calib = os.path.join(args.kv_dir, f"{source}-calibration.safetensors").encode()
    h = g.lib.gaac_bench_create(batch, context, KVH, d, src, 0, calib, 7, 0, 1)
    if not h:
        raise RuntimeError(g.lib.gaac_bench_error().decode())
    q = torch.randn(batch, Hq, d, device="cuda").to(torch.bfloat16)
    out = torch.empty_like(q)
    for path in (0, 1, 0, 1):  # warm (plans, attributes), then the launches to profile
        g.check(g.lib.gaac_bench_run(h, 0, path, 0, 0, 0, 0, Hq, q.data_ptr(), out.data_ptr(), None, None))
    torch.cuda.synchronize()
    g.lib.gaac_bench_free(h)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--kv-dir", default=os.path.expanduser("~/.cache/gaac/kv"))
    ap.add_argument("--shapes", default="llama,llama_realkv,gemma3,smollm2")
    ap.add_argument("--quick", action="store_true", help="fewer contexts")
    ap.add_argument("--cases", help="contexts and batches to run, as CTX:BATCH,... (default: all of CASES)")
    ap.add_argument("--quick-variants", action="store_true", help="skip the stage sweep and breakdown variants")
    ap.add_argument("--no-flashinfer", action="store_true")
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting new cases after this many seconds")
    ap.add_argument("--profile", metavar="SHAPE:CTX:BS",
                    help="only launch GAAC and the twin once each on this case (for ncu), then exit")
    args = ap.parse_args()
    if args.profile:
        profile(args)
        return
    t_start = time.time()
    logf = open(os.path.splitext(args.out)[0] + ".log", "w")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    g = Gaac(args.lib)
    flashinfer = None
    if not args.no_flashinfer:
        try:
            import flashinfer as fi_module
            flashinfer = fi_module
            log(f"flashinfer {getattr(flashinfer, '__version__', '?')}")
        except Exception as e:
            log(f"flashinfer unavailable: {e}")
    bw = copy_bandwidth()
    log(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, copy bandwidth {bw:.2f} TB/s (read+write)")
    results = []
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_tbps": round(bw, 3),
            "flashinfer": getattr(flashinfer, "__version__", None) if flashinfer else None}
    for shape in args.shapes.split(","):
        chosen = [tuple(int(x) for x in c.split(":")) for c in args.cases.split(",")] if args.cases else None
        for context, batch in chosen or (QUICK_CASES if args.quick else CASES):
            if time.time() - t_start > args.budget_s:
                log(f"budget reached: skipping {shape} {context} x{batch}")
                continue
            log(f"{shape} ctx {context} batch {batch}")
            try:
                run_case(g, shape, context, batch, args, flashinfer, results, log)
            except Exception as e:
                log(f"  case failed: {e}")
                results.append({"shape": shape, "context": context, "batch": batch, "error": str(e)[:500]})
            with open(args.out, "w") as f:
                json.dump({"meta": meta, "cases": results}, f, indent=1)
    # Summary table.
    log("\n| shape | ctx | bs | GAAC us | best BF16 | best us | speedup | twin us | cuDNN us | FA2 us | FI-TC us | exact |")
    log("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in results:
        m = c.get("methods", {})
        u = lambda n: f"{m[n]['us']:.1f}" if "us" in m.get(n, {}) else "-"
        log(f"| {c['shape']} | {c['context']} | {c['batch']} | {u('gaac')} | {c.get('best_bf16', '-')} | "
            f"{u(c['best_bf16']) if 'best_bf16' in c else '-'} | {c.get('speedup_vs_best_bf16', '-')} | {u('bf16_twin')} | "
            f"{u('sdpa_cudnn')} | {u('sdpa_flash')} | {u('flashinfer_tc')} | {c.get('bit_exact_vs_twin', '-')} |")
    log(f"total {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
