#!/usr/bin/env python3
"""Decode attention on the GPU, in one process: gaac's fused GAAC kernel, its BF16 twin, decompress-first,
PyTorch scaled_dot_product_attention (cuDNN and flash backends) and FlashInfer's paged decode (with and
without tensor cores), on the same values. Every method is validated against an fp32 reference before it
is timed; GAAC is also checked bit for bit against the twin run with the same split.

With --fp8 FORMAT (e4m3, e5m2, or both comma-separated), each case is also run over FP8 caches of the same
values (converted with a per-tensor scale for K and one for V, as vLLM's FP8 cache): GAAC-FP8 (gaac_fp8) and
its plain FP8 twin (fp8_twin), beside FlashInfer's paged decode over the same FP8 codes (flashinfer_fp8,
flashinfer_fp8_tc: q BF16, the scales passed to its run(), which applies v_scale to the output after its
kernel, inside the timed call), validated against fp32 attention over the codes' values times their scales;
GAAC-FP8 is checked bit for bit against the FP8 twin. They are ranked against the best FP8 peer and shown
beside the best BF16 kernel of the BF16 case run just before (--fp8-only skips the BF16 cases).

Timing: for each method, 30 calls are queued behind a 2 ms sleep kernel (so the host is ahead and launch
overhead does not count), rotating over enough copies of the data that the L2 never serves a call from the
previous one; the time per call is the median over 7 such batches. Effective TB/s = dense K+V bytes of the
case's element format (BF16, or FP8 for the FP8 cases) / time.

  python3 bench/gpu/bench_decode.py --lib build/bench/gpu/libgaac_gpu_bench.so --out bench.json \\
      [--kv-dir DIR] [--shapes llama,...] [--quick | --cases 65536:1,...] [--quick-variants] [--no-flashinfer]
      [--fp8 e4m3[,e5m2] [--fp8-only]]
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
FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


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
        if hasattr(L, "gaac_bench_create_fp8"):  # and these
            L.gaac_bench_create_fp8.restype = ctypes.c_void_p
            L.gaac_bench_create_fp8.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                                                ctypes.c_int, ctypes.c_uint64, ctypes.c_int, ctypes.c_int, ctypes.c_char_p]
            L.gaac_bench_export_fp8.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                                ctypes.POINTER(ctypes.c_float)]

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


def reference(q, k, v, scale, k_scale=1.0, v_scale=1.0):
    """fp32 attention of one query token per sequence: q [B, H, d], k/v [B, L, KVH, d] -> [B, H, d], the elements
    of k and v (BF16, or FP8 viewed as torch's float8) standing for their values times k_scale and v_scale."""
    B, H, d = q.shape
    kvh = k.shape[2]
    g = H // kvh
    out = torch.empty(B, H, d, dtype=torch.float32, device=q.device)
    for b in range(B):
        kb = k[b].float().permute(1, 0, 2) * k_scale  # [KVH, L, d]
        vb = v[b].float().permute(1, 0, 2) * v_scale
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


def case_source(args, source):
    """The library's arguments for a shape's KV source: the source, its layer and its calibration table."""
    if source == "synthetic":
        return b"synthetic", 0, b""
    return (os.path.join(args.kv_dir, f"{source}-gpl3-2048.safetensors").encode(), REAL_LAYER[source],
            os.path.join(args.kv_dir, f"{source}-calibration.safetensors").encode())


def query(batch, q_heads, head_dim, context):
    """The query of a case: the same for its BF16 and FP8 caches."""
    torch.manual_seed(context + batch)
    return torch.randn(batch, q_heads, head_dim, device="cuda").to(torch.bfloat16)


class Methods:
    """The methods of a case, each validated against the fp32 reference `ref` through `out` and then timed
    (time_calls over `copies` rotated copies); effective TB/s counts `dense_bytes`, the K+V bytes of a dense
    cache of the case's element format. A method that fails is recorded as an error."""

    def __init__(self, out, ref, copies, dense_bytes, log):
        self.out, self.ref, self.copies, self.dense_bytes, self.log = out, ref, copies, dense_bytes, log
        self.results = {}

    def measure(self, name, fn, physical_bytes=None, validate=True, extra=None):
        """Validates `fn` (one call on copy 0), then times it; `physical_bytes` are the bytes it reads (TB/s
        read), `extra` what its record also holds (or a function giving it, called inside the try)."""
        try:
            if callable(extra):  # the plan, asked for inside the try: a variant that cannot run is recorded
                extra = extra()
            self.out.fill_(float("nan"))
            fn(0)
            torch.cuda.synchronize()
            err = rel_error(self.out, self.ref) if validate else None
            if validate and not err < 2e-2:
                self.results[name] = {"error": f"validation failed: relative error {err}"}
                self.log(f"  {name}: VALIDATION FAILED ({err})")
                return
            med, lo, hi = time_calls(fn, self.copies)
            m = {"us": round(med, 2), "us_min": round(lo, 2), "us_max": round(hi, 2),
                 "effective_tbps": round(self.dense_bytes / med / 1e6, 3)}
            if err is not None:
                m["rel_error"] = float(f"{err:.3g}")
            if physical_bytes:
                m["bytes"] = physical_bytes
                m["tbps"] = round(physical_bytes / med / 1e6, 3)
            if extra:
                m.update(extra)
            self.results[name] = m
            self.log(f"  {name:28s} {med:9.2f} us  {m['effective_tbps']:6.3f} TB/s eff" +
                     (f"  {m['tbps']:6.3f} TB/s read" if physical_bytes else "") +
                     (f"  err {err:.2e}" if err is not None else ""))
        except Exception as e:  # a failing peer must not stop the run
            self.results[name] = {"error": str(e)[:300]}
            self.log(f"  {name}: ERROR {str(e)[:200]}")

    def build_failed(self, name, e):
        """Records a method that could not be set up (a build failure's cause is at the end of its message)."""
        self.results[name] = {"error": str(e)[:200] + " ... " + str(e)[-1500:]}
        self.log(f"  {name}: ERROR {str(e)[:100]} ... {str(e)[-1500:]}")


class Paths:
    """The paths of one case of the benchmark library on the query `q`, written to `out`: 0 GAAC (GAAC-FP8 in
    an FP8 case), 1 its twin, and in a BF16 case 2 decompress-first and 3 the decompression alone."""

    def __init__(self, g, handle, q_heads, q, out):
        self.g, self.h, self.q_heads, self.q, self.out = g, handle, q_heads, q, out

    def fn(self, path, work=0, stages=0, bps=0, warps=0):
        """A call of `path` on a copy, for Methods.measure; `fn.used` holds the split it ran with."""
        used = ctypes.c_int(0)

        def fn(i):
            self.g.check(self.g.lib.gaac_bench_run(self.h, i, path, work, stages, warps, bps, self.q_heads,
                                                   self.q.data_ptr(), self.out.data_ptr(), None, ctypes.byref(used)))
        fn.used = used
        return fn

    def plan(self, path, work=0, stages=0, warps=0):
        """The split plan of `path` (0 or 1) for a configuration."""
        buf = ctypes.create_string_buffer(256)
        self.g.check(self.g.lib.gaac_bench_plan(self.h, path, work, stages, warps, self.q_heads, buf, 256))
        return json.loads(buf.value.decode())

    def bit_exact(self):
        """Whether path 0 gives the bits of the twin run with its split, and how many outputs differ."""
        try:
            fg = self.fn(0)
            fg(0)
            torch.cuda.synchronize()
            a = self.out.clone()
            self.fn(1, bps=fg.used.value)(0)
            torch.cuda.synchronize()
            return {"bit_exact_vs_twin": bool(torch.equal(a.view(torch.int16), self.out.view(torch.int16))),
                    "bit_exact_differing": int((a.view(torch.int16) != self.out.view(torch.int16)).sum().item())}
        except Exception as e:
            return {"bit_exact_vs_twin": f"error: {e}"}


def shape_variants(g, h, paths, m, names, ours_bytes, twin_bytes, q_heads, kv_heads, warp_sizes=(4, 8, 16)):
    """CTAs of `warp_sizes` warps beside the plan's own choice, for path 0 and its twin (named `names`[0] and
    `names`[1] with _warpsN; the twin's best counts as a peer; a size the shape cannot take is recorded as an
    error), and groups of 9-16 query heads per KV head also in CTAs of 8 heads (two CTAs a KV head, the 8-head
    instance; _heads8)."""
    ours, twin = names
    for warps in warp_sizes:
        if paths.plan(0)["warps"] != warps:
            m.measure(f"{ours}_warps{warps}", paths.fn(0, warps=warps), ours_bytes,
                      extra=lambda warps=warps: {"plan": paths.plan(0, 0, 0, warps)})
        if paths.plan(1)["warps"] != warps:
            m.measure(f"{twin}_warps{warps}", paths.fn(1, warps=warps), twin_bytes,
                      extra=lambda warps=warps: {"plan": paths.plan(1, 0, 0, warps)})
    if q_heads // kv_heads > 8 and hasattr(g.lib, "gaac_bench_set_heads_per_cta"):
        g.check(g.lib.gaac_bench_set_heads_per_cta(h, 8))
        m.measure(f"{ours}_heads8", paths.fn(0), ours_bytes, extra=lambda: {"plan": paths.plan(0)})
        m.measure(f"{twin}_heads8", paths.fn(1), twin_bytes, extra=lambda: {"plan": paths.plan(1)})
        g.check(g.lib.gaac_bench_set_heads_per_cta(h, 0))


def paged_copies(k, v, copies):
    """K and V [B, L, KVH, d] as FlashInfer's paged NHD cache in pages of 16 tokens, [pages, 2, 16, KVH, d], and
    copies of it (`copies` in all)."""
    batch, context, kvh, d = k.shape
    pages = batch * context // 16
    caches = [torch.stack((k.reshape(pages, 16, kvh, d), v.reshape(pages, 16, kvh, d)), dim=1)]
    for _ in range(copies - 1):
        caches.append(caches[0].clone())
    return caches


def flashinfer_decode(flashinfer, m, caches, dims, kv_dtype, name, call):
    """FlashInfer's BatchDecodeWithPagedKVCacheWrapper (NHD, pages of 16 tokens, q BF16) over `caches` (copies of
    one paged cache of `kv_dtype`, for dims = (batch, context, q heads, KV heads, head_dim)), with tensor cores
    (`name`_tc) and, at head_dim 128, without (`name`); `call(wrapper, cache)` runs one decode into the case's
    output."""
    batch, context, q_heads, kv_heads, d = dims
    pages = context // 16
    indptr = torch.arange(0, batch + 1, dtype=torch.int32, device="cuda") * pages
    indices = torch.arange(0, batch * pages, dtype=torch.int32, device="cuda")
    last = torch.full((batch,), 16, dtype=torch.int32, device="cuda")
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for tc in ((True, False) if d == 128 else (True,)):
        method = f"{name}_tc" if tc else name
        try:
            w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=tc)
            w.plan(indptr, indices, last, q_heads, kv_heads, d, 16, q_data_type=torch.bfloat16, kv_data_type=kv_dtype)
            m.measure(method, lambda i, w=w: call(w, caches[i]), m.dense_bytes)
        except Exception as e:
            m.build_failed(method, e)


def rank(case, methods, ours, peers, key, also=()):
    """Names the fastest of `peers` that ran as case["best_<key>"], with its time over `ours`' as
    case["speedup_vs_best_<key>"], and records each such peer's (and `also`'s) time over ours' as its
    "gaac_speedup"."""
    ran = [n for n in peers if "us" in methods.get(n, {})]
    if not ran or "us" not in methods.get(ours, {}):
        return
    best = min(ran, key=lambda n: methods[n]["us"])
    case[f"best_{key}"] = best
    case[f"speedup_vs_best_{key}"] = round(methods[best]["us"] / methods[ours]["us"], 3)
    for n in ran + list(also):
        if "us" in methods.get(n, {}):
            methods[n]["gaac_speedup"] = round(methods[n]["us"] / methods[ours]["us"], 3)


def run_case(g, shape_name, context, batch, args, flashinfer, results, log):
    """The BF16 case: GAAC, its twin, decompress-first, variants, SDPA and FlashInfer; returns its record."""
    Hq, KVH, d, source = SHAPES[shape_name]
    bf16_bytes = batch * context * KVH * d * 2 * 2
    copies = max(1, min(16, math.ceil(L2_ROTATION_BYTES / bf16_bytes)))
    src, layer, calib = case_source(args, source)
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
    q = query(batch, Hq, d, context)
    scale = 1.0 / math.sqrt(d)
    ref = reference(q, k, v, scale)
    out = torch.empty_like(q)
    case = {"shape": shape_name, "q_heads": Hq, "kv_heads": KVH, "head_dim": d, "context": context, "batch": batch,
            "source": source, "copies": copies, "bf16_bytes": bf16_bytes, "cache": info, "build_s": round(time.time() - t0, 2)}
    m = Methods(out, ref, copies, bf16_bytes, log)
    methods, measure = m.results, m.measure
    paths = Paths(g, h, Hq, q, out)

    gaac_bytes, twin_bytes = info["gaac_bytes"], info["bf16_bytes"]
    measure("gaac", paths.fn(0), gaac_bytes, extra=lambda: {"plan": paths.plan(0)})
    measure("bf16_twin", paths.fn(1), twin_bytes, extra=lambda: {"plan": paths.plan(1)})
    case.update(paths.bit_exact())  # the twin with GAAC's split
    measure("decompress_first", paths.fn(2), gaac_bytes + 2 * twin_bytes)
    measure("decompress_only", paths.fn(3), gaac_bytes + twin_bytes, validate=False)
    if shape_name == "llama" and not args.quick_variants:
        for stages in (2, 3, 4):
            # The stage sweep is of CTAs of 4 warps (the default CTA of 16 has one setting).
            measure(f"gaac_stages{stages}", paths.fn(0, stages=stages, warps=4), gaac_bytes,
                    extra=lambda stages=stages: {"plan": paths.plan(0, 0, stages, 4)})
            measure(f"bf16_twin_stages{stages}", paths.fn(1, stages=stages, warps=4), twin_bytes,
                    extra=lambda stages=stages: {"plan": paths.plan(1, 0, stages, 4)})
    shape_variants(g, h, paths, m, ("gaac", "bf16_twin"), gaac_bytes, twin_bytes, Hq, KVH)
    if shape_name == "llama" and not args.quick_variants:
        for work, wname in ((1, "no_math"), (2, "no_decode"), (3, "load_only")):
            measure(f"gaac_{wname}", paths.fn(0, work=work), gaac_bytes, validate=False)
            if work != 2:
                measure(f"bf16_twin_{wname}", paths.fn(1, work=work), twin_bytes, validate=False)

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
        kv_cache = paged_copies(k, v, copies)
        flashinfer_decode(flashinfer, m, kv_cache, (batch, context, Hq, KVH, d), torch.bfloat16, "flashinfer",
                          lambda w, cache: out.copy_(w.run(q, cache)))
        del kv_cache
    g.lib.gaac_bench_free(h)
    del k, v
    torch.cuda.empty_cache()

    peers = ["bf16_twin", "sdpa_cudnn", "sdpa_flash", "flashinfer", "flashinfer_tc"]
    peers += [n for n in methods if n.startswith(("bf16_twin_stages", "bf16_twin_warps", "bf16_twin_heads"))]
    rank(case, methods, "gaac", peers, "bf16", also=["decompress_first"])
    case["methods"] = methods
    results.append(case)
    return case


def run_fp8_case(g, shape_name, context, batch, element, args, flashinfer, bf16_case, results, log):
    """The FP8 case of `element` (e4m3, e5m2): GAAC-FP8, its FP8 twin (with their CTA variants) and FlashInfer
    over the same FP8 codes, ranked against the best FP8 peer and, when `bf16_case` (the same values in BF16)
    ran, against its best BF16 kernel; returns its record."""
    Hq, KVH, d, source = SHAPES[shape_name]
    fp8_bytes = batch * context * KVH * d * 2
    copies = max(1, min(16, math.ceil(L2_ROTATION_BYTES / fp8_bytes)))
    src, layer, _ = case_source(args, source)  # the FP8 table is learnt on the codes themselves
    t0 = time.time()
    h = g.lib.gaac_bench_create_fp8(batch, context, KVH, d, src, layer, 7, 0, copies, element.encode())
    if not h:
        raise RuntimeError(g.lib.gaac_bench_error().decode())
    info = json.loads(g.lib.gaac_bench_describe(h).decode())
    k_host = torch.empty(batch, context, KVH, d, dtype=torch.uint8)
    v_host = torch.empty_like(k_host)
    scales = (ctypes.c_float * 2)()
    g.check(g.lib.gaac_bench_export_fp8(h, k_host.data_ptr(), v_host.data_ptr(), scales))
    k_scale, v_scale = scales[0], scales[1]
    dtype = FP8_DTYPES[element]
    k8, v8 = k_host.cuda(), v_host.cuda()
    k, v = k8.view(dtype), v8.view(dtype)
    del k_host, v_host
    q = query(batch, Hq, d, context)
    ref = reference(q, k, v, 1.0 / math.sqrt(d), k_scale, v_scale)
    out = torch.empty_like(q)
    log(f"  cache: {info['gaac_bytes'] / 1e6:.1f} MB of GAAC-FP8 units for {info['fp8_bytes'] / 1e6:.1f} MB of FP8 "
        f"({info['ratio']:.3f}x), {100 * info['raw_fraction']:.2f}% raw tiles; k_scale {k_scale:.4g}, v_scale {v_scale:.4g}")
    case = {"shape": shape_name, "fp8": element, "q_heads": Hq, "kv_heads": KVH, "head_dim": d, "context": context,
            "batch": batch, "source": source, "copies": copies, "fp8_bytes": fp8_bytes, "cache": info,
            "build_s": round(time.time() - t0, 2)}
    m = Methods(out, ref, copies, fp8_bytes, log)
    paths = Paths(g, h, Hq, q, out)
    gaac_bytes, twin_bytes = info["gaac_bytes"], info["fp8_bytes"]
    m.measure("gaac_fp8", paths.fn(0), gaac_bytes, extra=lambda: {"plan": paths.plan(0)})
    m.measure("fp8_twin", paths.fn(1), twin_bytes, extra=lambda: {"plan": paths.plan(1)})
    case.update(paths.bit_exact())  # the twin with GAAC-FP8's split
    # FP8 caches have the default CTA only (its size and stages).
    shape_variants(g, h, paths, m, ("gaac_fp8", "fp8_twin"), gaac_bytes, twin_bytes, Hq, KVH, warp_sizes=())
    if flashinfer is not None:
        kv_cache = [c.view(dtype) for c in paged_copies(k8, v8, copies)]
        flashinfer_decode(flashinfer, m, kv_cache, (batch, context, Hq, KVH, d), dtype, "flashinfer_fp8",
                          lambda w, cache: w.run(q, cache, k_scale=k_scale, v_scale=v_scale, out=out))
        del kv_cache
    g.lib.gaac_bench_free(h)
    del k, v, k8, v8
    torch.cuda.empty_cache()

    methods = m.results
    peers = ["fp8_twin", "flashinfer_fp8", "flashinfer_fp8_tc"]
    peers += [n for n in methods if n.startswith(("fp8_twin_warps", "fp8_twin_heads"))]
    rank(case, methods, "gaac_fp8", peers, "fp8")
    if bf16_case and "best_bf16" in bf16_case and "us" in methods.get("gaac_fp8", {}):
        best_us = bf16_case["methods"][bf16_case["best_bf16"]]["us"]
        case.update(best_bf16=bf16_case["best_bf16"], best_bf16_us=best_us,
                    speedup_vs_best_bf16=round(best_us / methods["gaac_fp8"]["us"], 3))
    case["methods"] = methods
    results.append(case)
    return case


def profile(args):
    """One launch of the fused GAAC kernel and one of the twin on a case, for a profiler to catch."""
    shape, context, batch = args.profile.split(":")
    context, batch = int(context), int(batch)
    Hq, KVH, d, source = SHAPES[shape]
    g = Gaac(args.lib)
    src, layer, calib = case_source(args, source)
    h = g.lib.gaac_bench_create(batch, context, KVH, d, src, layer, calib, 7, 0, 1)
    if not h:
        raise RuntimeError(g.lib.gaac_bench_error().decode())
    q = torch.randn(batch, Hq, d, device="cuda").to(torch.bfloat16)
    out = torch.empty_like(q)
    for path in (0, 1, 0, 1):  # warm (plans, attributes), then the launches to profile
        g.check(g.lib.gaac_bench_run(h, 0, path, 0, 0, 0, 0, Hq, q.data_ptr(), out.data_ptr(), None, None))
    torch.cuda.synchronize()
    g.lib.gaac_bench_free(h)


def attempt(run, results, record, log):
    """run()'s result; on failure None, the failure logged and recorded in `results` as `record` with its message."""
    try:
        return run()
    except Exception as e:
        log(f"  case failed: {e}")
        results.append({**record, "error": str(e)[:500]})
        return None


def bf16_summary(results, log):
    """The summary table of the BF16 cases."""
    log("\n| shape | ctx | bs | GAAC us | best BF16 | best us | speedup | twin us | cuDNN us | FA2 us | FI-TC us | exact |")
    log("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in results:
        m = c.get("methods", {})
        u = lambda n: f"{m[n]['us']:.1f}" if "us" in m.get(n, {}) else "-"
        log(f"| {c['shape']} | {c['context']} | {c['batch']} | {u('gaac')} | {c.get('best_bf16', '-')} | "
            f"{u(c['best_bf16']) if 'best_bf16' in c else '-'} | {c.get('speedup_vs_best_bf16', '-')} | {u('bf16_twin')} | "
            f"{u('sdpa_cudnn')} | {u('sdpa_flash')} | {u('flashinfer_tc')} | {c.get('bit_exact_vs_twin', '-')} |")


def fp8_summary(results, log):
    """The summary table of the FP8 cases: GAAC-FP8 against the best FP8 peer, and beside the best BF16 kernel."""
    log("\n| shape | ctx | bs | fp8 | GAAC-FP8 us | best FP8 | best us | speedup | twin us | FI-TC us | FI us | "
        "best BF16 | BF16 us | vs BF16 | exact |")
    log("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in results:
        m = c.get("methods", {})
        u = lambda n: f"{m[n]['us']:.1f}" if "us" in m.get(n, {}) else "-"
        log(f"| {c['shape']} | {c['context']} | {c['batch']} | {c.get('fp8', '-')} | {u('gaac_fp8')} | "
            f"{c.get('best_fp8', '-')} | {u(c['best_fp8']) if 'best_fp8' in c else '-'} | "
            f"{c.get('speedup_vs_best_fp8', '-')} | {u('fp8_twin')} | {u('flashinfer_fp8_tc')} | {u('flashinfer_fp8')} | "
            f"{c.get('best_bf16', '-')} | {c.get('best_bf16_us', '-')} | {c.get('speedup_vs_best_bf16', '-')} | "
            f"{c.get('bit_exact_vs_twin', '-')} |")


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
    ap.add_argument("--fp8", metavar="FORMAT[,FORMAT]",
                    help="also run each case over FP8 caches of these element formats (e4m3, e5m2)")
    ap.add_argument("--fp8-only", action="store_true", help="with --fp8: skip the BF16 cases")
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting new cases after this many seconds")
    ap.add_argument("--profile", metavar="SHAPE:CTX:BS",
                    help="only launch GAAC and the twin once each on this case (for ncu), then exit")
    args = ap.parse_args()
    fp8_formats = args.fp8.split(",") if args.fp8 else []
    if any(f not in FP8_DTYPES for f in fp8_formats):
        ap.error(f"--fp8 takes e4m3 and/or e5m2, not {args.fp8}")
    if args.fp8_only and not fp8_formats:
        ap.error("--fp8-only needs --fp8")
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
    if fp8_formats and not hasattr(g.lib, "gaac_bench_create_fp8"):
        ap.error(f"{args.lib} has no FP8 cases (gaac_bench_create_fp8)")
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
    results, fp8_results = [], []
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_tbps": round(bw, 3),
            "flashinfer": getattr(flashinfer, "__version__", None) if flashinfer else None}

    def save():
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "cases": results, **({"fp8_cases": fp8_results} if fp8_formats else {})}, f, indent=1)

    def within_budget(what):
        if time.time() - t_start <= args.budget_s:
            return True
        log(f"budget reached: skipping {what}")
        return False

    for shape in args.shapes.split(","):
        chosen = [tuple(int(x) for x in c.split(":")) for c in args.cases.split(",")] if args.cases else None
        for context, batch in chosen or (QUICK_CASES if args.quick else CASES):
            record = {"shape": shape, "context": context, "batch": batch}
            bf16_case = None
            if not args.fp8_only and within_budget(f"{shape} {context} x{batch}"):
                log(f"{shape} ctx {context} batch {batch}")
                bf16_case = attempt(lambda: run_case(g, shape, context, batch, args, flashinfer, results, log),
                                    results, record, log)
                save()
            for element in fp8_formats:
                if not within_budget(f"{shape} {context} x{batch} {element}"):
                    continue
                log(f"{shape} ctx {context} batch {batch} fp8 {element}")
                attempt(lambda: run_fp8_case(g, shape, context, batch, element, args, flashinfer, bf16_case,
                                             fp8_results, log), fp8_results, {**record, "fp8": element}, log)
                save()
    if not args.fp8_only:
        bf16_summary(results, log)
    if fp8_formats:
        fp8_summary(fp8_results, log)
    log(f"total {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
