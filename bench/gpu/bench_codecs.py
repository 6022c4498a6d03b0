#!/usr/bin/env python3
"""GPU codec comparison (the paper's Figure 4): gaac's codec beside nvCOMP, DietGPU, DFloat11, ZipServ and
SplitZip, in one process, on the same bytes.

Data: one layer of KV, K and V of [tokens, 8, 128] BF16 (65,536 tokens: 268 MB), synthetic and real (SmolLM2's
KV with pairs of its 64-wide heads side by side, as bench_capi.cpp builds `smollm2x6`). With gaac's library the
dense bytes come from gaac_codec_copy_dense, so every codec compresses exactly what gaac compresses; with
--no-gaac they are made here (synthetic: normal values with per-channel scales; real: the same pairing of the
dump's heads, tiled).

For every codec: compression ratio (BF16 bytes / compressed bytes) on the whole layer; encode latency of one
16-token block (16 tokens x 8 heads x 128 x K and V = 64 KiB of BF16) and encode throughput on the whole layer;
decode latency of the whole layer and GB/s of BF16 produced. Decoded bytes are checked equal to the input
before anything is timed; a codec that fails the check is reported and not timed.

Timing (the same for every codec): CUDA events on the current stream; a warm-up; then batches of calls queued
behind a ~2 ms torch.cuda._sleep kernel so that launch overhead is hidden where the API lets the host run
ahead; the time per call is the median over the batches. APIs that synchronise or allocate inside a call
(nvCOMP's Python API, SplitZip's encode, which reads its escape count back) cannot run ahead: their queued
time then includes their host work, and every codec's synchronised wall time per call is reported beside it.
Large inputs and outputs are rotated over two copies so that the L2 (50 MB) never serves a 268 MB call from the
previous one; one-block encodes rotate over distinct blocks of the layer.

  python3 bench/gpu/bench_codecs.py --lib build/bench/gpu/libgaac_gpu_bench.so --peers-dir .gpu/peers \\
      --kv-dir .gpu/data/kv --out codecs.json [--tokens 65536] [--quick] [--no-gaac] [--only nvcomp,dietgpu,...]

--peers-dir holds peers.tar.xz made by scripts/prepare_codec_peers.sh (unpacked into --unpack-dir on first
use) or an already unpacked tree (site/, lib/, splitzip/, manifest.json).
"""
import argparse
import ctypes
import importlib.util
import json
import math
import os
import statistics
import sys
import tarfile
import time
import traceback

import torch

KV_HEADS, HEAD_DIM, BLOCK_TOKENS = 8, 128, 16
REAL_SOURCE = "smollm2x6"


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------------------
# Timing


class Timer:
    def __init__(self, quick):
        self.batches = 3 if quick else 7
        self.block_calls = 40 if quick else 100
        self.target_ms = 30.0 if quick else 80.0

    @staticmethod
    def sleep():
        torch.cuda._sleep(4_000_000)  # ~2 ms at 1.98 GHz: the host queues the calls meanwhile

    def wall_us(self, fn, n, calls):
        ts = []
        for i in range(calls):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn(i % n)
            torch.cuda.synchronize()
            ts.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(ts)

    def measure(self, fn, n, small, rearm=None):
        """fn(i) issues call i (i mod n: rotation). Returns (queued µs per call, spread, wall µs per call).
        With `rearm` (a codec whose call consumes its input, as gaac's finalize does) every call gets its own
        copy: at most n calls between two rearm() calls, which run untimed before each batch."""
        if rearm:
            rearm()
        for i in range(3):  # warm-up: compilation, allocator, caches of the codec
            fn(i % n)
        torch.cuda.synchronize()
        if rearm:
            rearm()
        wall = self.wall_us(fn, n, min(n, 5 if not small else 20) if rearm else (5 if not small else 20))
        if small:
            calls = self.block_calls
        else:
            calls = max(3, min(30, int(self.target_ms * 1000 / max(wall, 1.0))))
        if rearm:
            calls = min(calls, n)
        per = []
        for _ in range(self.batches):
            torch.cuda.synchronize()
            if rearm:
                rearm()
            self.sleep()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for i in range(calls):
                fn(i % n)
            e.record()
            e.synchronize()
            per.append(s.elapsed_time(e) * 1000.0 / calls)
        return statistics.median(per), [min(per), max(per)], wall, calls


def short(e, n=160):
    """One line of an exception, for tables."""
    msg = f"{type(e).__name__}: {e}".strip().splitlines()[0]
    return msg if len(msg) <= n else msg[:n - 3] + "..."


def stream_ptr():
    return torch.cuda.current_stream().cuda_stream


def same_bytes(a, b):
    return a.numel() * a.element_size() == b.numel() * b.element_size() and torch.equal(
        a.contiguous().view(torch.uint8).reshape(-1), b.contiguous().view(torch.uint8).reshape(-1))


# ----------------------------------------------------------------------------------------------------------
# Data


class Layer:
    """K and V [tokens, heads, dim] bf16 on the device, with the views the codecs need."""

    def __init__(self, name, k, v, describe=None):
        self.name, self.k, self.v = name, k.contiguous(), v.contiguous()
        self.tokens = k.shape[0]
        self.kv = torch.stack([self.k, self.v])  # [2, T, H, D] contiguous: K then V
        self.kv2 = self.kv.clone()  # second copy: rotation against the L2
        self.bf16_bytes = self.kv.numel() * 2
        self.gaac = describe
        # Blocks of 16 tokens as contiguous 64 KiB buffers [K block; V block], for one-block encodes.
        nblk = self.tokens // BLOCK_TOKENS
        self.n_rot = min(256, nblk)
        idx = torch.linspace(0, nblk - 1, self.n_rot).round().long().tolist()
        self.blocks = torch.stack([self.kv[:, b * BLOCK_TOKENS:(b + 1) * BLOCK_TOKENS] for b in idx]).contiguous()
        self.block_bytes = self.blocks[0].numel() * 2  # 65536

    def block(self, i):
        return self.blocks[i]  # [2, 16, H, D]


def synthetic_layer(tokens, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape = (tokens, KV_HEADS, HEAD_DIM)
    scale_k = torch.exp(torch.randn((KV_HEADS, HEAD_DIM), generator=g, device="cuda") * 1.0)
    scale_v = torch.exp(torch.randn((KV_HEADS, HEAD_DIM), generator=g, device="cuda") * 0.5) * 0.2
    bias_k = torch.randn((KV_HEADS, HEAD_DIM), generator=g, device="cuda") * scale_k
    k = (torch.randn(shape, generator=g, device="cuda") * scale_k + bias_k).to(torch.bfloat16)
    v = (torch.randn(shape, generator=g, device="cuda") * scale_v).to(torch.bfloat16)
    return k, v


def real_layer_from_dump(path, tokens):
    """bench_capi.cpp's pairing: head h of width 128 = dump (layer, head) pairs 2h and 2h+1 side by side."""
    from safetensors.torch import load_file

    t = load_file(path)
    layers = sorted({int(n.split(".")[1]) for n in t if n.startswith("k.")})
    k0 = t[f"k.{layers[0]}"]
    n, heads, narrow = k0.shape
    if 2 * narrow != HEAD_DIM or len(layers) * heads < 2 * KV_HEADS:
        raise RuntimeError(f"cannot pair {path}: {len(layers)} layers of {heads} heads of width {narrow}")
    out = []
    for kind in "kv":
        dst = torch.empty((n, KV_HEADS, HEAD_DIM), dtype=torch.bfloat16)
        for h in range(KV_HEADS):
            for part in range(2):
                pair = 2 * h + part
                l, hh = layers[pair // heads], pair % heads
                dst[:, h, part * narrow:(part + 1) * narrow] = t[f"{kind}.{l}"][:, hh, :]
        reps = (tokens + n - 1) // n
        out.append(dst.repeat(reps, 1, 1)[:tokens].cuda())
    return out[0], out[1]


class Gaac:
    def __init__(self, path):
        L = self.lib = ctypes.CDLL(path)
        vp, i, cp = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p
        L.gaac_bench_error.restype = cp
        L.gaac_codec_open.restype = vp
        L.gaac_codec_open.argtypes = [cp, i, cp, i, i, i, ctypes.c_uint64]
        L.gaac_codec_describe.restype = cp
        L.gaac_codec_describe.argtypes = [vp]
        L.gaac_codec_copy_dense.argtypes = [vp, i, vp, vp]
        L.gaac_codec_arm.argtypes = [vp, i, i, vp]
        L.gaac_codec_finalize.argtypes = [vp, i, i, vp]
        L.gaac_codec_finalize_check.argtypes = [vp, i, i]
        L.gaac_codec_decompress.argtypes = [vp, vp, vp, vp]
        L.gaac_codec_close.argtypes = [vp]
        L.gaac_codec_snapshot.argtypes = [vp, ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_double),
                                          ctypes.POINTER(ctypes.c_uint64)]
        for f in ("gaac_codec_copy_dense", "gaac_codec_arm", "gaac_codec_finalize", "gaac_codec_finalize_check",
                  "gaac_codec_decompress"):
            getattr(L, f).restype = i

    def check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what}: {self.lib.gaac_bench_error().decode(errors='replace')}")

    def open(self, source, layer, calibration, tokens, seed):
        h = self.lib.gaac_codec_open(source.encode(), layer, calibration.encode(), tokens, KV_HEADS, HEAD_DIM, seed)
        if not h:
            raise RuntimeError("gaac_codec_open: " + self.lib.gaac_bench_error().decode(errors="replace"))
        return h

    def layer(self, name, h, tokens):
        desc = json.loads(self.lib.gaac_codec_describe(h).decode())
        k = torch.empty((tokens, KV_HEADS, HEAD_DIM), dtype=torch.bfloat16, device="cuda")
        v = torch.empty_like(k)
        self.check(self.lib.gaac_codec_copy_dense(h, 0, k.data_ptr(), stream_ptr()), "copy_dense K")
        self.check(self.lib.gaac_codec_copy_dense(h, 1, v.data_ptr(), stream_ptr()), "copy_dense V")
        torch.cuda.synchronize()
        return Layer(name, k, v, desc)


# ----------------------------------------------------------------------------------------------------------
# Codecs. Each: prepare(layer) compresses the whole layer (untimed), checks the round trip and returns the
# compressed bytes; then encode_block / encode_layer / decode_layer return fn(i) to time, or None (with a reason
# in self.notes).


class Codec:
    name = "?"
    random_access = "no"

    def __init__(self):
        self.static_notes = []  # said of every run; run_codec() resets self.notes to these before prepare()
        self.notes = []

    def prepare(self, L):
        raise NotImplementedError

    def encode_block(self, L):
        return None

    def encode_layer(self, L):
        return None

    def decode_layer(self, L):
        return None


class GaacCodec(Codec):
    name = "gaac (GAAC)"
    random_access = "yes: 16-token tiles, decoded inside attention"

    def __init__(self, g, h):
        super().__init__()
        self.g, self.h = g, h

    def prepare(self, L):
        d = L.gaac
        self.extra = {k: d.get(k) for k in ("codec_ratio", "resident_ratio", "packed_bytes", "resident_bytes",
                                           "tiles", "raw_tiles")}
        self.notes.append(f"resident ratio {d.get('resident_ratio', float('nan')):.4f} (slots, as stored)")
        self.out = [(torch.empty_like(L.k), torch.empty_like(L.v)) for _ in range(2)]
        ok, ov = self.out[0]
        self.g.check(self.g.lib.gaac_codec_decompress(self.h, ok.data_ptr(), ov.data_ptr(), stream_ptr()), "decompress")
        torch.cuda.synchronize()
        if not (same_bytes(ok, L.k) and same_bytes(ov, L.v)):
            raise RuntimeError("lossless check failed: gaac_codec_decompress != dense input")
        return d.get("packed_bytes") or d["bf16_bytes"] / d["codec_ratio"]

    def recheck(self, L):
        ok, ov = self.out[1]
        self.g.check(self.g.lib.gaac_codec_decompress(self.h, ok.data_ptr(), ov.data_ptr(), stream_ptr()), "decompress")
        torch.cuda.synchronize()
        if not (same_bytes(ok, L.k) and same_bytes(ov, L.v)):
            raise RuntimeError("decompress after the encode timings != dense input")

    def _arm(self, blocks, copies):
        """Finalize consumes its open blocks (a block is encoded once; finalizing it again does nothing), so
        each timed call gets an armed copy of its own, and rearm() restores them all between batches."""
        lib, h, s = self.g.lib, self.h, stream_ptr()
        self.g.check(lib.gaac_codec_arm(h, blocks, copies, s), "arm")
        self.g.check(lib.gaac_codec_finalize(h, blocks, 0, s), "finalize")
        torch.cuda.synchronize()
        self.g.check(lib.gaac_codec_finalize_check(h, blocks, 0), "finalize_check")

        def rearm():
            torch.cuda.synchronize()
            self.g.check(lib.gaac_codec_arm(h, blocks, copies, s), "arm")
        return (lambda i: lib.gaac_codec_finalize(h, blocks, i, s)), copies, rearm

    def encode_block(self, L):
        return self._arm(1, 128)

    def encode_blocks_64(self, L):
        """A decode step of a batch of 64 sequences that all complete a block: one call."""
        return self._arm(64, 128)

    def encode_layer(self, L):
        return self._arm(L.tokens // BLOCK_TOKENS, 4)

    def decode_layer(self, L):
        lib, h, s = self.g.lib, self.h, stream_ptr()
        ptrs = [(a.data_ptr(), b.data_ptr()) for a, b in self.out]
        return (lambda i: lib.gaac_codec_decompress(h, ptrs[i][0], ptrs[i][1], s)), 2


class NvcompCodec(Codec):
    """nvCOMP's Python API on its fastest documented path: a CompressConfig built from the size
    (codec.compression_config) and the DecompressConfig built from it, with preallocated outputs, which the
    API documents as free of stream synchronisation; the ratio comes from a plain encode (the same bitstream)."""

    random_access = "no: 64 KiB chunks, decompressed to memory first"

    def __init__(self, nvcomp, label, opts):
        super().__init__()
        self.nvcomp, self.name, self.opts = nvcomp, label, opts
        self.codec = nvcomp.Codec(cuda_stream=stream_ptr(), **opts)
        self.view = None  # how input arrays are given (found in prepare)

    def _array(self, t):
        import cupy as cp
        b = t.contiguous().view(torch.uint8).reshape(-1)
        if self.view == "typed":
            typed = {"<f2": cp.float16, "<u2": cp.uint16}.get(self.opts.get("data_type"), cp.uint8)
            return self.nvcomp.as_array(cp.from_dlpack(b).view(typed), stream_ptr())
        return self.nvcomp.as_array(b, stream_ptr())

    def _configs(self, nbytes):
        cc = self.codec.compression_config(nbytes)
        return cc, self.codec.decompression_config(cc)

    def _out(self, array):
        import cupy as cp
        return cp.empty(int(self.codec.get_max_comp_buffer_size(array)), dtype=cp.uint8)

    def prepare(self, L):
        import cupy as cp
        err = None
        for view in ("typed", "u1"):
            self.view = view
            try:
                plain = self.codec.encode(self._array(L.kv))
                break
            except Exception as e:  # noqa: BLE001 - try the other view
                err = e
        else:
            raise RuntimeError(f"encode failed: {err}")
        torch.cuda.synchronize()
        size = plain.buffer_size
        dec = cp.empty(L.bf16_bytes, dtype=cp.uint8)
        self.codec.decode(plain, out=dec)
        torch.cuda.synchronize()
        if not same_bytes(torch.from_dlpack(dec), L.kv):
            raise RuntimeError("lossless check failed: decode(encode(layer)) != layer")
        self.dec = [cp.empty(L.bf16_bytes, dtype=cp.uint8) for _ in range(2)]
        try:  # the timed path: preconfigured, preallocated
            self.preconfigured = True
            self.cc, self.dc = self._configs(L.bf16_bytes)
            arrays = [self._array(kv) for kv in (L.kv, L.kv2)]
            self.comp_bufs = [self._out(a) for a in arrays]  # kept: the encoded Arrays may only view them
            self.comp = [self.codec.encode(a, out=b, compression_config=self.cc)
                         for a, b in zip(arrays, self.comp_bufs)]
            self._check_timed_path(L)
            self.notes.append("preconfigured encode/decode (compression_config/decompression_config) into "
                              "preallocated buffers")
        except Exception as e:  # noqa: BLE001 - fall back to the plain calls (which synchronise)
            self.preconfigured = False
            self.notes.append(f"preconfigured path failed ({short(e)}); plain encode/decode timed, which "
                              "allocate and may synchronise")
            self.comp = [plain, self.codec.encode(self._array(L.kv2))]
            self._check_timed_path(L)
        self.notes.append(f"input given as {'typed' if self.view == 'typed' else 'uint8'} array")
        return size

    def _decode(self, r):
        if self.preconfigured:
            return self.codec.decode(self.comp[r], out=self.dec[r], decompression_config=self.dc)
        return self.codec.decode(self.comp[r], out=self.dec[r])

    def _check_timed_path(self, L):
        for r in range(2):
            self.dec[r].fill(0)  # on CuPy's stream: finish it before the decode on ours
            torch.cuda.synchronize()
            self._decode(r)
            torch.cuda.synchronize()
            if not same_bytes(torch.from_dlpack(self.dec[r]), L.kv):
                raise RuntimeError("lossless check failed on the timed path")

    def _encoder(self, arrays, nbytes):
        enc = self.codec.encode
        if not self.preconfigured:
            return lambda i: enc(arrays[i])
        cc, _ = self._configs(nbytes)
        outs = [self._out(a) for a in arrays]
        return lambda i: enc(arrays[i], out=outs[i], compression_config=cc)

    def encode_block(self, L):
        return self._encoder([self._array(L.block(i)) for i in range(L.n_rot)], L.block_bytes), L.n_rot

    def encode_layer(self, L):
        return self._encoder([self._array(L.kv), self._array(L.kv2)], L.bf16_bytes), 2

    def decode_layer(self, L):
        return self._decode, 2


class DietGpuCodec(Codec):
    name = "DietGPU (float, bf16)"
    random_access = "no: ANS over whole arrays, decompressed to memory first"

    def __init__(self, libpath):
        super().__init__()
        L = self.lib = ctypes.CDLL(libpath)
        vp, i, pp = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)
        u32p = ctypes.POINTER(ctypes.c_uint32)
        L.dietgpu_error.restype = ctypes.c_char_p
        L.dietgpu_create.restype = vp
        L.dietgpu_create.argtypes = [vp, ctypes.c_size_t]
        L.dietgpu_destroy.argtypes = [vp]
        L.dietgpu_max_compressed_bytes.restype = ctypes.c_uint32
        L.dietgpu_max_compressed_bytes.argtypes = [ctypes.c_uint32]
        L.dietgpu_max_temp_usage.restype = ctypes.c_size_t
        L.dietgpu_max_temp_usage.argtypes = [vp]
        L.dietgpu_compress_bf16.restype = i
        L.dietgpu_compress_bf16.argtypes = [vp, i, pp, u32p, pp, vp, vp]
        L.dietgpu_decompress_bf16.restype = i
        L.dietgpu_decompress_bf16.argtypes = [vp, i, pp, pp, u32p, vp, vp, vp]
        self.temp = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
        self.h = L.dietgpu_create(self.temp.data_ptr(), self.temp.numel())
        if not self.h:
            raise RuntimeError("dietgpu_create: " + L.dietgpu_error().decode())

    def check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what}: {self.lib.dietgpu_error().decode(errors='replace')}")

    @staticmethod
    def ptrs(ts):
        return (ctypes.c_void_p * len(ts))(*[t.data_ptr() for t in ts])

    @staticmethod
    def u32(xs):
        return (ctypes.c_uint32 * len(xs))(*xs)

    def _comp_job(self, members):
        """Compression of a batch of tensors: returns (args for dietgpu_compress_bf16, outputs, sizes)."""
        words = [m.numel() for m in members]
        outs = [torch.empty(self.lib.dietgpu_max_compressed_bytes(w), dtype=torch.uint8, device="cuda") for w in words]
        sizes = torch.zeros(len(members), dtype=torch.int32, device="cuda")
        args = (self.h, len(members), self.ptrs(members), self.u32(words), self.ptrs(outs), sizes.data_ptr())
        return args, outs, sizes

    def prepare(self, L):
        self.jobs = []
        for kv in (L.kv, L.kv2):
            args, outs, sizes = self._comp_job([kv[0], kv[1]])
            self.check(self.lib.dietgpu_compress_bf16(*args, stream_ptr()), "compress")
            self.jobs.append((args, outs, sizes))
        torch.cuda.synchronize()
        comp = int(self.jobs[0][2].sum().item())
        self.outs = [(torch.empty_like(L.k), torch.empty_like(L.v)) for _ in range(2)]
        self.dec_args = []
        for r in range(2):
            outs = self.jobs[r][1]
            ok = torch.zeros(2, dtype=torch.uint8, device="cuda")
            words = torch.zeros(2, dtype=torch.int32, device="cuda")
            self.dec_args.append((self.h, 2, self.ptrs(outs), self.ptrs(list(self.outs[r])),
                                  self.u32([L.k.numel(), L.v.numel()]), ok.data_ptr(), words.data_ptr(), ok, words))
        a = self.dec_args[0]
        self.check(self.lib.dietgpu_decompress_bf16(*a[:7], stream_ptr()), "decompress")
        torch.cuda.synchronize()
        if not (bool(a[7].all()) and same_bytes(self.outs[0][0], L.k) and same_bytes(self.outs[0][1], L.v)):
            raise RuntimeError("lossless check failed: DietGPU decompress != input")
        self.notes.append(f"probBits 10; temp memory used {self.lib.dietgpu_max_temp_usage(self.h) >> 20} MiB")
        return comp

    def encode_block(self, L):
        jobs = [self._comp_job([L.block(i)[0], L.block(i)[1]]) for i in range(L.n_rot)]
        f, s = self.lib.dietgpu_compress_bf16, stream_ptr()
        return (lambda i: f(*jobs[i][0], s)), L.n_rot

    def encode_layer(self, L):
        f, s, jobs = self.lib.dietgpu_compress_bf16, stream_ptr(), self.jobs
        return (lambda i: f(*jobs[i][0], s)), 2

    def decode_layer(self, L):
        f, s, a = self.lib.dietgpu_decompress_bf16, stream_ptr(), self.dec_args
        return (lambda i: f(*a[i][:7], s)), 2


class DFloat11Codec(Codec):
    """DFloat11's format (Huffman-coded exponents, sign+mantissa bytes) and its own decode kernel (decode.ptx,
    launched through CuPy exactly as dfloat11.py does). Its code table and look-up tables come from its own
    dfloat11_utils (get_codec, get_32bit_codec, get_luts); its encoder is a pure-Python loop over every element
    (hours for 134M values), so the bitstream, gaps and output positions are produced here by a vectorised
    re-implementation of dfloat11_utils.encode, checked byte for byte against the original on a sample, and
    the whole layer is checked lossless through their kernel. Decode only is timed, as in the paper."""

    name = "DFloat11 (decode)"
    random_access = "no: Huffman stream, whole-tensor decode pass"
    BPT, TPB = 8, 512  # dfloat11.py: bytes_per_thread, threads_per_block

    def __init__(self, site):
        super().__init__()
        import cupy as cp

        self.cp = cp
        root = os.path.join(site, "dfloat11")
        spec = importlib.util.spec_from_file_location("df11_utils", os.path.join(root, "dfloat11_utils.py"))
        self.utils = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.utils)  # imports torch, numpy, dahuffman, tqdm only
        self.kernel = cp.RawModule(path=os.path.join(root, "decode.ptx")).get_function("decode")
        self.static_notes.append("encode not timed (host-side in DFloat11); bitstream built by a vectorised copy "
                                 "of its encoder")

    def _encode_gpu(self, x, table, eof):
        """dfloat11_utils.encode on the device: returns (encoded uint8, gaps uint8, output_positions uint32)."""
        dev = x.device
        W = x.reshape(-1).view(torch.int16)
        exp = ((W >> 7) & 0xFF).long()
        lens_lut = torch.zeros(256, dtype=torch.long)
        vals_lut = torch.zeros(256, dtype=torch.long)
        for sym, (b, v) in table.items():
            if isinstance(sym, int):
                lens_lut[sym], vals_lut[sym] = b, v
        lens_lut, vals_lut = lens_lut.to(dev), vals_lut.to(dev)
        lens, vals = lens_lut[exp], vals_lut[exp]
        n = exp.numel()
        ends = torch.cumsum(lens, 0)
        starts = ends - lens
        T = int(ends[-1].item())
        nbytes = T // 8 + (1 if T % 8 else 0)
        acc = torch.zeros(nbytes + 8, dtype=torch.int32, device=dev)
        r = starts & 7
        word = vals << (40 - r - lens)  # the code at bit r of a 40-bit window starting at byte starts//8
        base = starts >> 3
        for j in range(5):  # codes never overlap: adding bytes == or-ing bits
            acc.index_add_(0, base + j, ((word >> (8 * (4 - j))) & 0xFF).to(torch.int32))
        if T % 8:  # the last partial byte is completed with the start of the end-of-file code, as encode() does
            be, ve = table[eof]
            free = 8 - T % 8
            acc[T // 8] += (ve >> (be - free)) if be >= free else ((ve << (free - be)) & 0xFF)
        encoded = acc[:nbytes].to(torch.uint8)
        c = starts >> 6  # 8 * bytes_per_thread bits per thread
        first = torch.ones(n, dtype=torch.bool, device=dev)
        first[1:] = c[1:] != c[:-1]
        gaps = (starts[first] - (c[first] << 6))
        blk = starts >> 15  # 8 * bytes_per_thread * threads_per_block bits per block
        firstb = torch.ones(n, dtype=torch.bool, device=dev)
        firstb[1:] = blk[1:] != blk[:-1]
        outpos = torch.nonzero(firstb).reshape(-1)
        if int(c[-1].item()) + 1 != gaps.numel():
            raise RuntimeError("a thread's bit range holds no code start: format assumption broken")
        tail_g, tail_o = [], []
        if T % 8:
            if T // 64 + 1 > gaps.numel():
                tail_g = [T - (T // 64) * 64]
            if T // 32768 + 1 > outpos.numel():
                tail_o = [n]
        gaps = torch.cat([gaps, torch.tensor(tail_g, dtype=torch.long, device=dev)])
        outpos = torch.cat([outpos, torch.tensor(tail_o + [n], dtype=torch.long, device=dev)])
        blocks = math.ceil(nbytes / (self.TPB * self.BPT))
        total = self.TPB * blocks
        if gaps.numel() < total:
            gaps = torch.cat([gaps, torch.zeros(total - gaps.numel(), dtype=torch.long, device=dev)])
        bits = ((gaps[:, None] >> torch.arange(4, -1, -1, device=dev)) & 1).reshape(-1)
        pad = (-bits.numel()) % 8
        if pad:
            bits = torch.cat([bits, torch.zeros(pad, dtype=torch.long, device=dev)])
        weights = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.long, device=dev)
        gaps_packed = (bits.reshape(-1, 8) * weights).sum(1).to(torch.uint8)
        return encoded, gaps_packed, outpos.to(torch.int64)

    def _compress(self, x):
        u = self.utils
        _, counter = u.get_codec(x)
        codec, _, table = u.get_32bit_codec(counter)
        import contextlib, io
        with contextlib.redirect_stdout(io.StringIO()):  # get_luts prints its tables
            luts = u.get_luts(table).cuda()
        enc, gaps, outpos = self._encode_gpu(x, table, codec._eof)
        W = x.reshape(-1).view(torch.int16)
        sm = (((W >> 8) & 0x80) | (W & 0x7F)).to(torch.uint8)
        op_u32 = outpos.to(torch.int32)  # < 2^31 elements
        shared = self.TPB * 4 + 4 + int((outpos[1:] - outpos[:-1]).max().item()) * 2
        return dict(codec=codec, table=table, luts=luts, enc=enc, sm=sm, gaps=gaps, outpos=op_u32, shared=shared,
                    n=x.numel())

    def _sample_check(self, x, c):
        """Our encoder against dfloat11_utils.encode on the first elements (the same codec)."""
        import numpy as np
        m = 40000
        xs = x.reshape(-1)[:m].contiguous()
        exp = ((xs.view(torch.int16) >> 7) & 0xFF).to(torch.uint8).cpu().tolist()
        import contextlib, io
        with contextlib.redirect_stderr(io.StringIO()):
            ref_enc, ref_gaps, ref_op = self.utils.encode(exp, c["codec"], self.BPT, self.TPB)
        enc, gaps, op = self._encode_gpu(xs, c["table"], c["codec"]._eof)
        same = (np.array_equal(ref_enc, enc.cpu().numpy()) and np.array_equal(ref_gaps, gaps.cpu().numpy())
                and np.array_equal(ref_op.astype(np.int64), op.cpu().numpy()))
        if not same:
            raise RuntimeError("vectorised encoder differs from dfloat11_utils.encode on a sample")

    def _launch(self, c, out):
        blocks = math.ceil(c["enc"].numel() / (self.TPB * self.BPT))
        self.kernel((blocks,), (self.TPB,), (c["luts"].data_ptr(), c["enc"].data_ptr(), c["sm"].data_ptr(),
                                              c["outpos"].data_ptr(), c["gaps"].data_ptr(), out.data_ptr(),
                                              c["luts"].shape[0], c["enc"].numel(), c["n"]),
                    shared_mem=c["shared"])

    def prepare(self, L):
        self.c = [self._compress(L.k), self._compress(L.v)]
        self._sample_check(L.k, self.c[0])
        need = max(c["shared"] for c in self.c)
        if need > 48 * 1024:
            self.kernel.max_dynamic_shared_size_bytes = need
        self.outs = [(torch.empty_like(L.k), torch.empty_like(L.v)) for _ in range(2)]
        import warnings
        with warnings.catch_warnings():  # CuPy 14 prefers Stream.from_external; this still works
            warnings.simplefilter("ignore", DeprecationWarning)
            self.ext = self.cp.cuda.ExternalStream(stream_ptr())
        with self.ext:
            self._launch(self.c[0], self.outs[0][0])
            self._launch(self.c[1], self.outs[0][1])
        torch.cuda.synchronize()
        if not (same_bytes(self.outs[0][0], L.k) and same_bytes(self.outs[0][1], L.v)):
            raise RuntimeError("lossless check failed: DFloat11 decode != input")
        size = 0
        for c in self.c:  # what dfloat11 stores per tensor (its compression-factor formula), plus the LUTs
            size += c["enc"].numel() + c["sm"].numel() + c["outpos"].numel() * 4 + c["gaps"].numel() + c["luts"].numel()
        self.notes.append(f"shared memory per block {need} B")
        return size

    def decode_layer(self, L):
        c, outs, launch, ext = self.c, self.outs, self._launch, self.ext

        def run(i):
            with ext:
                launch(c[0], outs[i][0])
                launch(c[1], outs[i][1])
        return run, 2


class ZipServCodec(Codec):
    name = "ZipServ (decode)"
    random_access = "yes: 64x64 tiles (TCA-TBE), decoded inside its fused GEMM"

    def __init__(self, libpath):
        super().__init__()
        L = self.lib = ctypes.CDLL(libpath)
        vp = ctypes.c_void_p
        L.zipserv_error.restype = ctypes.c_char_p
        L.zipserv_compress.restype = vp
        L.zipserv_compress.argtypes = [vp, ctypes.c_int, ctypes.c_int]
        L.zipserv_describe.restype = ctypes.c_char_p
        L.zipserv_describe.argtypes = [vp]
        L.zipserv_decompress.restype = ctypes.c_int
        L.zipserv_decompress.argtypes = [vp, vp, vp]
        L.zipserv_free.argtypes = [vp]
        self.static_notes.append("encode not timed (host-side compressor in ZipServ); K and V compressed as "
                                 "[T*8, 128] matrices, top-7 exponents each")
        self.h = []

    def prepare(self, L):
        for h in self.h:
            self.lib.zipserv_free(h)
        self.h = []
        t0 = time.perf_counter()
        size = 0
        for x in (L.k, L.v):
            host = x.reshape(-1, HEAD_DIM).view(torch.int16).cpu().contiguous()
            h = self.lib.zipserv_compress(host.data_ptr(), host.shape[0], HEAD_DIM)
            if not h:
                raise RuntimeError("zipserv_compress: " + self.lib.zipserv_error().decode())
            self.h.append(h)
            size += json.loads(self.lib.zipserv_describe(h).decode())["compressed_bytes"]
        self.notes.append(f"host compression {time.perf_counter() - t0:.1f} s")
        self.outs = [(torch.empty_like(L.k), torch.empty_like(L.v)) for _ in range(2)]
        self._run(0)
        torch.cuda.synchronize()
        if not (same_bytes(self.outs[0][0], L.k) and same_bytes(self.outs[0][1], L.v)):
            raise RuntimeError("lossless check failed: ZipServ decompress != input")
        return size

    def _run(self, i):
        s = stream_ptr()
        for h, out in zip(self.h, self.outs[i]):
            rc = self.lib.zipserv_decompress(h, out.data_ptr(), s)
            if rc:
                raise RuntimeError(self.lib.zipserv_error().decode())

    def decode_layer(self, L):
        return self._run, 2

    def __del__(self):
        for h in getattr(self, "h", []):
            self.lib.zipserv_free(h)


class SplitZipCodec(Codec):
    name = "SplitZip"
    random_access = "no: escapes in one global list (chunk-local offsets)"

    def __init__(self, splitzip_dir):
        super().__init__()
        sys.path.insert(0, splitzip_dir)
        from codec_gpu import ChunkLocalSplitZipGPU

        self.cls = ChunkLocalSplitZipGPU
        self.static_notes.append("codebooks calibrated on the layer itself (K and V each); encode reads its "
                                 "escape count back (synchronises)")

    def prepare(self, L):
        self.ck, self.cv = self.cls(device="cuda"), self.cls(device="cuda")
        cov = (self.ck.calibrate(L.k), self.cv.calibrate(L.v))
        self.enc = [(self.ck.encode(kv[0]), self.cv.encode(kv[1])) for kv in (L.kv, L.kv2)]
        dk, dv = self.ck.decode(self.enc[0][0]), self.cv.decode(self.enc[0][1])
        torch.cuda.synchronize()
        if not (same_bytes(dk.reshape(L.k.shape), L.k) and same_bytes(dv.reshape(L.v.shape), L.v)):
            raise RuntimeError("lossless check failed: SplitZip decode != input")
        e = self.enc[0]
        self.notes.append(f"top-16 coverage K {cov[0] * 100:.3f}% V {cov[1] * 100:.3f}%; escapes {e[0].n_esc + e[1].n_esc}")
        return e[0].compressed_bytes + e[1].compressed_bytes

    def encode_block(self, L):
        ck, cv = self.ck, self.cv
        return (lambda i: (ck.encode(L.block(i)[0]), cv.encode(L.block(i)[1]))), L.n_rot

    def encode_layer(self, L):
        ck, cv, kvs = self.ck, self.cv, (L.kv, L.kv2)
        return (lambda i: (ck.encode(kvs[i][0]), cv.encode(kvs[i][1]))), 2

    def decode_layer(self, L):
        ck, cv, enc = self.ck, self.cv, self.enc
        return (lambda i: (ck.decode(enc[i][0]), cv.decode(enc[i][1]))), 2


NVCOMP_CONFIGS = [
    ("nvCOMP ANS <f2", dict(algorithm="ANS", data_type="<f2")),
    ("nvCOMP ANS <f2, latency policy", dict(algorithm="ANS", data_type="<f2", execution_policy="LATENCY")),
    ("nvCOMP ANS bytes", dict(algorithm="ANS")),
    ("nvCOMP Bitcomp <u2", dict(algorithm="Bitcomp", data_type="<u2")),
    ("nvCOMP Cascaded <u2", dict(algorithm="Cascaded", data_type="<u2")),
    ("nvCOMP LZ4", dict(algorithm="LZ4")),
    ("nvCOMP GDeflate", dict(algorithm="GDeflate")),
    ("nvCOMP Zstd", dict(algorithm="Zstd")),
]


# ----------------------------------------------------------------------------------------------------------
# Peers' files


def unpack_peers(peers_dir, unpack_dir):
    """Returns the root of an unpacked peers tree (site/, lib/, splitzip/, manifest.json)."""
    if peers_dir is None:
        return None
    if os.path.isfile(os.path.join(peers_dir, "manifest.json")):
        return peers_dir
    archive = os.path.join(peers_dir, "peers.tar.xz")
    if not os.path.isfile(archive):
        raise SystemExit(f"--peers-dir {peers_dir}: neither manifest.json nor peers.tar.xz there")
    stamp = os.path.join(unpack_dir, ".from")
    key = f"{os.path.abspath(archive)} {os.path.getsize(archive)} {os.path.getmtime(archive)}"
    if not (os.path.isfile(stamp) and open(stamp).read() == key):
        t0 = time.perf_counter()
        os.makedirs(unpack_dir, exist_ok=True)
        with tarfile.open(archive, "r:xz") as tf:
            try:
                tf.extractall(unpack_dir, filter="data")
            except TypeError:  # Python without extraction filters
                tf.extractall(unpack_dir)
        open(stamp, "w").write(key)
        log(f"unpacked {archive} into {unpack_dir} in {time.perf_counter() - t0:.1f} s")
    return unpack_dir


def import_nvcomp(site):
    sys.path.insert(0, site)
    try:
        from nvidia import nvcomp
    except ImportError:
        import nvidia  # a regular (non-namespace) 'nvidia' package elsewhere: add ours to its path
        nvidia.__path__.append(os.path.join(site, "nvidia"))
        from nvidia import nvcomp
    return nvcomp


def make_codecs(args, root, wanted, unavailable):
    """Constructs the peers; a peer that cannot be set up goes into `unavailable` with the reason."""
    codecs = []

    def add(key, label, ctor):
        if key not in wanted:
            return
        try:
            made = ctor()
            codecs.extend(made if isinstance(made, list) else [made])
        except Exception as e:  # noqa: BLE001 - record why, go on
            unavailable[label] = short(e, 400)
            log(f"[{label}] unavailable: {e}")

    if root is None:
        for key, label in (("nvcomp", "nvCOMP"), ("dietgpu", "DietGPU"), ("dfloat11", "DFloat11"),
                           ("zipserv", "ZipServ"), ("splitzip", "SplitZip")):
            if key in wanted:
                unavailable[label] = "no --peers-dir given"
        return codecs
    site, lib = os.path.join(root, "site"), os.path.join(root, "lib")

    def nvcomp_all():
        nv = import_nvcomp(site)
        out = []
        for label, opts in NVCOMP_CONFIGS:
            opts = dict(opts)
            if "execution_policy" in opts:
                opts["execution_policy"] = getattr(nv.ExecutionPolicy, opts["execution_policy"])
            try:
                out.append(NvcompCodec(nv, label, opts))
            except Exception as e:  # noqa: BLE001
                unavailable[label] = short(e, 400)
        return out

    add("nvcomp", "nvCOMP", nvcomp_all)
    add("dietgpu", "DietGPU", lambda: DietGpuCodec(os.path.join(lib, "libdietgpu_capi.so")))
    add("dfloat11", "DFloat11", lambda: DFloat11Codec(site))
    add("zipserv", "ZipServ", lambda: ZipServCodec(os.path.join(lib, "libzipserv_capi.so")))
    add("splitzip", "SplitZip", lambda: SplitZipCodec(os.path.join(root, "splitzip")))
    return codecs


# ----------------------------------------------------------------------------------------------------------


def run_codec(codec, L, timer):
    codec.notes = list(codec.static_notes)
    row = dict(codec=codec.name, random_access=codec.random_access, ratio=None, compressed_bytes=None,
               lossless=None, encode_block_us=None, encode_block_wall_us=None, encode_layer_us=None,
               encode_gbs=None, encode_layer_wall_us=None, decode_us=None, decode_gbs=None, decode_wall_us=None,
               errors={}, notes=codec.notes)
    try:
        t0 = time.perf_counter()
        size = codec.prepare(L)
        row.update(compressed_bytes=int(size), ratio=L.bf16_bytes / size, lossless=True)
        if hasattr(codec, "extra"):
            row["gaac"] = codec.extra
        log(f"  [{codec.name}] ratio {row['ratio']:.4f}, lossless ok ({time.perf_counter() - t0:.1f} s)")
    except Exception as e:  # noqa: BLE001
        row["lossless"] = False if "lossless" in str(e) else None
        row["errors"]["prepare"] = short(e, 400)
        log(f"  [{codec.name}] prepare failed: {e}")
        traceback.print_exc(file=sys.stderr)
        return row
    phases = [("encode_block", True, L.block_bytes), ("encode_layer", False, L.bf16_bytes),
              ("decode_layer", False, L.bf16_bytes)]
    if isinstance(codec, GaacCodec):
        phases.insert(1, ("encode_blocks_64", True, 64 * L.block_bytes))
    for phase, small, bytes_ in phases:
        try:
            got = getattr(codec, phase)(L)
            if got is None:
                continue
            fn, n, rearm = got if len(got) == 3 else (*got, None)
            us, spread, wall, calls = timer.measure(fn, n, small, rearm)
            torch.cuda.synchronize()
            if phase == "encode_blocks_64":
                row["gaac"].update(finalize_64_blocks_us=us, finalize_64_blocks_wall_us=wall,
                                   finalize_64_blocks_spread_us=spread)
                codec.notes.append(f"64 blocks in one call: {us:.1f} µs ({wall:.0f} wall)")
            elif phase == "encode_block":
                row.update(encode_block_us=us, encode_block_wall_us=wall, encode_block_spread_us=spread)
            elif phase == "encode_layer":
                row.update(encode_layer_us=us, encode_gbs=bytes_ / us / 1e3, encode_layer_wall_us=wall,
                           encode_layer_spread_us=spread)
            else:
                row.update(decode_us=us, decode_gbs=bytes_ / us / 1e3, decode_wall_us=wall, decode_spread_us=spread)
            log(f"  [{codec.name}] {phase}: {us:.1f} µs/call queued ({calls} calls), {wall:.1f} µs wall")
        except Exception as e:  # noqa: BLE001
            row["errors"][phase] = short(e, 400)
            log(f"  [{codec.name}] {phase} failed: {e}")
            traceback.print_exc(file=sys.stderr)
    if isinstance(codec, GaacCodec):  # a .gaac snapshot of the layer, made by the CPU and by the GPU
        try:
            cpu_us, gpu_us, size = ctypes.c_double(), ctypes.c_double(), ctypes.c_uint64()
            codec.g.check(codec.g.lib.gaac_codec_snapshot(codec.h, ctypes.byref(cpu_us), ctypes.byref(gpu_us),
                                                          ctypes.byref(size)), "snapshot")
            row["gaac"].update(snapshot_cpu_us=cpu_us.value, snapshot_gpu_us=gpu_us.value, snapshot_bytes=size.value)
            codec.notes.append(f".gaac image of the layer ({size.value / 1e6:.1f} MB, ratio "
                               f"{L.bf16_bytes / size.value:.4f}): CPU {cpu_us.value / 1e3:.0f} ms on one thread, "
                               f"GPU {gpu_us.value / 1e3:.1f} ms with transfers, same bytes")
            log(f"  [{codec.name}] snapshot: CPU {cpu_us.value / 1e3:.1f} ms, GPU {gpu_us.value / 1e3:.1f} ms, "
                f"{size.value} bytes, equal")
        except Exception as e:  # noqa: BLE001
            row["errors"]["snapshot"] = str(e)
    if isinstance(codec, GaacCodec):  # the device result must still equal the CPU encoder's bytes
        try:
            codec.g.check(codec.g.lib.gaac_codec_finalize_check(codec.h, L.tokens // BLOCK_TOKENS, 1),
                          "finalize_check after timing")
            codec.recheck(L)
        except Exception as e:  # noqa: BLE001
            row["errors"]["finalize_check"] = str(e)
    return row


def fmt(x, spec):
    return "—" if x is None else format(x, spec)


def table(dataset, rows, unavailable):
    out = [f"\n### {dataset['name']}: {dataset['tokens']} tokens, {dataset['bf16_bytes'] / 1e6:.0f} MB BF16 (K+V); "
           f"device-to-device copy {dataset['copy_tbs']:.2f} TB/s (read + written)\n",
           "| codec | ratio | random access per tile | encode µs, 1 block (wall) | encode GB/s, layer | "
           "decode µs, 64K layer (wall) | decode GB/s of BF16 | notes |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        enc_b = "—" if r["encode_block_us"] is None else f"{r['encode_block_us']:.1f} ({r['encode_block_wall_us']:.0f})"
        dec = "—" if r["decode_us"] is None else f"{r['decode_us']:.0f} ({r['decode_wall_us']:.0f})"
        notes = "; ".join(list(r["notes"]) + [f"{k} FAILED: {v}" for k, v in r["errors"].items()])
        ratio = fmt(r["ratio"], ".4f") if r["lossless"] else ("lossless FAILED" if r["lossless"] is False else "—")
        out.append(f"| {r['codec']} | {ratio} | {r['random_access']} | {enc_b} | {fmt(r['encode_gbs'], '.1f')} | "
                   f"{dec} | {fmt(r['decode_gbs'], '.1f')} | {notes.replace('|', '/')} |")
    for name, why in unavailable.items():
        out.append(f"| {name} | not run | | | | | | {why.replace('|', '/')} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", help="gaac's libgaac_gpu_bench.so")
    ap.add_argument("--no-gaac", action="store_true", help="skip gaac; make the data here")
    ap.add_argument("--kv-dir", default=os.path.expanduser("~/.cache/gaac/kv"))
    ap.add_argument("--self-calibrate", action="store_true", help="gaac calibrates on the real layer itself")
    ap.add_argument("--peers-dir", help="peers.tar.xz from scripts/prepare_codec_peers.sh, or its unpacked tree")
    ap.add_argument("--unpack-dir", default="/tmp/gaac-peers")
    ap.add_argument("--out", help="JSON results")
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--datasets", default="synthetic,real")
    ap.add_argument("--only", default="gaac,nvcomp,dietgpu,dfloat11,zipserv,splitzip")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = ap.parse_args()
    if args.tokens <= 0 or args.tokens % BLOCK_TOKENS:
        ap.error("--tokens must be a positive multiple of 16")
    if not args.no_gaac and not args.lib:
        ap.error("--lib is required unless --no-gaac")
    wanted = set(args.only.split(","))
    torch.cuda.init()
    # Everything runs on one explicit stream (never 0, which some APIs read as "make your own stream").
    torch.cuda.set_stream(torch.cuda.Stream())
    timer = Timer(args.quick)
    root = unpack_peers(args.peers_dir, args.unpack_dir)
    manifest = json.load(open(os.path.join(root, "manifest.json"))) if root else {}
    unavailable = {}
    peers = make_codecs(args, root, wanted, unavailable)
    g = None if args.no_gaac or "gaac" not in wanted else Gaac(args.lib)
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, tokens=args.tokens,
                  timing=dict(batches=timer.batches, block_calls=timer.block_calls, sleep="torch.cuda._sleep(4e6)"),
                  peers=manifest, unavailable=unavailable, datasets=[])
    real_path = os.path.join(args.kv_dir, f"{REAL_SOURCE}-gpl3-2048.safetensors")
    calib_path = os.path.join(args.kv_dir, f"{REAL_SOURCE}-calibration.safetensors")
    tables = []
    for ds in args.datasets.split(","):
        log(f"== data set {ds}")
        h = None
        try:
            if g is not None:
                if ds == "synthetic":
                    h = g.open("synthetic", 0, "", args.tokens, args.seed)
                else:
                    cal = "" if args.self_calibrate or not os.path.isfile(calib_path) else calib_path
                    h = g.open(real_path, 0, cal, args.tokens, args.seed)
                L = g.layer(ds, h, args.tokens)
            else:
                k, v = synthetic_layer(args.tokens, args.seed) if ds == "synthetic" else \
                    real_layer_from_dump(real_path, args.tokens)
                L = Layer(ds, k, v)
        except Exception as e:  # noqa: BLE001
            log(f"data set {ds} unavailable: {e}")
            result["datasets"].append(dict(name=ds, error=str(e)))
            continue
        codecs = ([GaacCodec(g, h)] if h else []) + peers
        rows = [run_codec(c, L, timer) for c in codecs]
        # The memory's speed in this run: a device-to-device copy of the layer (bytes read + written / time).
        copy_us, _, _, _ = timer.measure(lambda i: (L.kv2 if i % 2 else L.kv).copy_(L.kv if i % 2 else L.kv2), 2, False)
        copy_tbs = 2 * L.bf16_bytes / copy_us / 1e6
        log(f"  device-to-device copy of the layer: {copy_us:.1f} µs, {copy_tbs:.2f} TB/s read + written")
        info = dict(name=ds, tokens=L.tokens, bf16_bytes=L.bf16_bytes, block_bytes=L.block_bytes,
                    copy_us=copy_us, copy_tbs=copy_tbs,
                    source="gaac_codec_copy_dense" if h else "made in bench_codecs.py", gaac=L.gaac, rows=rows)
        result["datasets"].append(info)
        tables.append(table(info, rows, unavailable))
        print(tables[-1], flush=True)
        save(args.out, result)
        if h:
            g.lib.gaac_codec_close(h)
        del L
        torch.cuda.empty_cache()
    print("\n".join(tables))
    print("\nencode µs: one 16-token block (64 KiB BF16), per call, queued behind a sleep kernel (synchronised wall "
          "time per call in brackets); decode µs: the whole layer. GB/s count BF16 bytes.")
    save(args.out, result)


def save(path, result):
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1, default=str)
        log(f"wrote {path}")


if __name__ == "__main__":
    main()
