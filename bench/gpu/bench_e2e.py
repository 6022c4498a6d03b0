#!/usr/bin/env python3
"""End-to-end decoding on a GPU with transformers: whole decode steps of real models (SmolLM2-135M and Gemma 3
270M from our GGUF files), of models with Llama-3.1-8B's and Gemma 3 270M's geometry (random bf16 weights:
timing only) and of any transformers model directory you give, over three caches in one process:

  gaac     GaacCache(device="cuda"): compressed tiles on the device, GPU finalize, the fused kernel
  twin     GaacCache(cache_format="bf16"): the same structure and kernel over BF16 tiles
  sdpa     transformers' DynamicCache with its SDPA attention
  flashinfer  FlashInfer's paged BF16 decode (tensor cores, pages of 16 tokens) in the same model
           (bench/gpu/flashinfer_cache.py), where the flashinfer package imports

Every decoding step is captured in a CUDA graph (torch.cuda.CUDAGraph around one model forward: static input
ids and positions; gaac's kernels do no host sync and no allocation) and replayed; the step time is the median
of the replays, each between two CUDA events. Each replay is a real step: the gaac caches grow by one token a
replay (plans made for the longest length reached), DynamicCache concatenates as it does eagerly. Beside each
step, the same graph of the attention calls alone (all layers, same cache) gives the share of the step that
reads KV, and one eager step is timed for the overhead that graphs remove.

Experiments:
  equal-batch   step latency at batch 1 and 8 at each model's contexts (CONTEXTS, BATCHES)
  serving       same GPU, same KV memory: for each KV budget and context, each cache holds as many sequences
                as fit (counted by filling real caches) and one step decodes them all; sequences held, step
                time, tokens/s, the attention's share of the step and the raw-tile share of the gaac cache

The prompt of each model (SmolLM2: a text; the others: seeded random token ids) is filled once by a batch-1
prefill (SDPA, every layer kept whole) and copied into every sequence of a batch; the gaac caches are filled
from it on the device (begin, write, finalize); exponent windows are learnt on 4096 positions spread over it.
Every cache is released (and the garbage collected, PyTorch's cache emptied) before the next is made.

  python3 bench/gpu/bench_e2e.py --out results.json [--models DIR] [--hf-models DIR] [--only smollm2,gemma3,llama8b]
      [--experiments equal-batch,serving] [--quick] [--contexts 8192,...] [--batches 1,8] [--budgets 40G,100G]
      [--kinds gaac,twin,sdpa,flashinfer]
  # your own model and budget (the serving table for your GPU):
  python3 bench/gpu/bench_e2e.py --out mine.json --model-path /path/to/model --experiments serving --budgets 40G
"""
import argparse
import gc
import json
import math
import pathlib
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import gaac
import gaac.transformers as gt

try:  # the FlashInfer configuration, where its package is installed
    import flashinfer
    import flashinfer_cache as fic
except ImportError as e:
    flashinfer = fic = None
    FLASHINFER_MISSING = str(e)

ROOT = pathlib.Path(__file__).resolve().parents[2]
GGUF = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf"}
# Equal batch: contexts and batch sizes per model (gemma3_geometry: Gemma 3 270M's geometry, random weights).
CONTEXTS = {"smollm2": [4096, 8192], "gemma3": [4096, 8192, 16384, 32768], "gemma3_geometry": [8192, 32768],
            "llama8b": [32768, 65536, 131072]}
BATCHES = {"smollm2": [1, 8], "gemma3": [1, 8], "gemma3_geometry": [1, 8], "llama8b": [1, 8]}
# Serving at equal memory: KV budgets per model and the contexts of every budget.
SERVING_BUDGETS = {"llama8b": [40 * 10**9, 100 * 10**9], "gemma3": [2 * 10**9, 8 * 10**9],
                   "gemma3_geometry": [2 * 10**9, 8 * 10**9], "smollm2": [2 * 10**9, 8 * 10**9]}
SERVING_CONTEXTS = [8192, 16384, 32768]
REPLAYS = 30
# Tokens written into a gaac cache per begin when filling it from a prefill. A forward's blocks stay raw (two
# units a tile) until its end, and a fill writes every sequence at once: chunks of one block keep that transient
# to one open block a sequence and layer, as a server's chunked prefill of one sequence at a time does (chunks of
# 4096 tokens cost 6-15% of the sequences, chunks of 256 still 4-10% at Gemma's 2 GB).
FILL_CHUNK = 16
GROWTH = 64  # tokens a cache may grow by while being timed (warm-up, capture, replays)


def log(*args):
    print(*args, flush=True)


def load_model(name, models_dir, hf_dir=None):
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    t0 = time.time()
    if name == "llama8b":
        config = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                             num_key_value_heads=8, head_dim=128, vocab_size=128256, rope_theta=500000.0,
                             max_position_embeddings=131072 + 1024, rms_norm_eps=1e-5, tie_word_embeddings=False)
        with torch.device("cuda"):
            model = LlamaForCausalLM._from_config(config, dtype=torch.bfloat16)
    elif name == "gemma3_geometry":  # Gemma 3 270M's configuration, random weights: timing only
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig

        config = Gemma3TextConfig(vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                                  num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
                                  max_position_embeddings=32768 + 1024, query_pre_attn_scalar=256)
        with torch.device("cuda"):
            model = Gemma3ForCausalLM._from_config(config, dtype=torch.bfloat16)
    elif name not in GGUF:  # a transformers model directory
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16).cuda()
    else:
        converted = pathlib.Path(hf_dir or "/nonexistent") / GGUF[name]  # saved by save_pretrained: loads in seconds
        if converted.is_dir():
            model = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.bfloat16).cuda()
        else:
            model = AutoModelForCausalLM.from_pretrained(models_dir, gguf_file=GGUF[name], dtype=torch.bfloat16).cuda()
    model.eval()
    log(f"[{name}] loaded in {time.time() - t0:.0f} s")
    return model


def prompt_ids(name, model, models_dir, tokens):
    """A prompt of `tokens` ids: SmolLM2's tokens of the calibration text, repeated; seeded random ids for Gemma 3
    (transformers' GGUF tokenizer for it is not the model's) and for the random-weight model."""
    if name != "smollm2":
        top = min(20000 if name.startswith("gemma3") else 100000, model.config.get_text_config().vocab_size)
        return torch.randint(100, top, (1, tokens), generator=torch.Generator().manual_seed(0)).cuda()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(models_dir, gguf_file=GGUF[name])
    ids = tok((ROOT / "data" / "calibration_text.txt").read_text(), return_tensors="pt").input_ids[0]
    return ids.repeat(tokens // ids.numel() + 1)[:tokens][None].cuda()


@torch.no_grad()
def prefill(model, ids):
    """K and V of every layer for `ids` ([1, tokens]), each [1, kv_heads, tokens, head_dim], all tokens kept."""
    from transformers import DynamicCache

    model.set_attn_implementation("sdpa")
    cache = DynamicCache()  # no config: every layer keeps every token, sliding ones too
    model(input_ids=ids, use_cache=True, logits_to_keep=1, **{gt.cache_argument(model): cache})
    return [(l.keys, l.values) for l in cache.layers]


def gaac_cache(model, kv, table, fmt, batch, context, budget=None):
    """A GaacCache on the GPU holding `context` tokens of `kv` in each of `batch` sequences."""
    cache = gt.GaacCache(model.config, table, max_tokens=context + GROWTH, batch=batch, cache_format=fmt,
                         device="cuda", budget_bytes=budget, plan_tokens=context + GROWTH)
    stream = torch.cuda.current_stream().cuda_stream
    for layer, (k, v) in enumerate(kv):
        cache.layers[layer].lazy_initialization(k, v)
    # In chunks, each finalized (after its last layer's rows) before the next: a block is raw (two units a
    # tile) until finalized, so one begin of the whole prompt would need room for all of it raw.
    for first in range(0, context, FILL_CHUNK):
        n = min(FILL_CHUNK, context - first)
        cache.kv.begin(n, stream=stream, attended=False)  # a fill: nothing attends it
        for layer, (k, v) in enumerate(kv):
            cache.kv.write(layer, k[:, :, first:first + n].expand(batch, -1, -1, -1),
                           v[:, :, first:first + n].expand(batch, -1, -1, -1), stream)
    cache.kv.check()
    cache.note_written(context)  # the columns the cache's positions and masks count
    return cache


def dynamic_cache(model, kv, batch, context):
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)  # sliding layers keep their window, as transformers decodes
    for layer, (k, v) in enumerate(kv):
        cache.update(k[:, :, :context].expand(batch, -1, -1, -1).contiguous(),
                     v[:, :, :context].expand(batch, -1, -1, -1).contiguous(), layer)
    return cache


def softmax_scale(text):
    scale = getattr(text, "query_pre_attn_scalar", None)
    return scale ** -0.5 if scale else cache_head_dim(text) ** -0.5


def flashinfer_cache(model, kv, batch, context):
    """`batch` sequences of `context` tokens of `kv` in FlashInfer's paged layout, decoding with its kernel."""
    text = model.config.get_text_config()
    return fic.FlashInferCache(flashinfer, gt._geometry(model.config), text.num_attention_heads, kv, batch, context,
                               softmax_scale(text), GROWTH)


def cache_bytes(kind, cache):
    if kind == "sdpa":
        return sum(l.keys.nbytes + l.values.nbytes for l in cache.layers)
    if kind == "flashinfer":
        return cache.nbytes
    u = cache.usage()
    return u["resident_bytes"]


def graph_time(fn, replays=REPLAYS, on_replay=None):
    """Median milliseconds of `fn` captured in a CUDA graph (two eager warm-up calls first) and replayed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    # No garbage collection while capturing: a collected cache would free device memory (cudaFree) mid-capture.
    gc.collect()
    gc.disable()
    try:
        with torch.cuda.graph(graph, capture_error_mode="relaxed"):
            fn()
    finally:
        gc.enable()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(replays + 1):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        if i > 0:
            times.append(start.elapsed_time(end))
        if on_replay is not None:
            on_replay(i)
    del graph
    return statistics.median(times)


def eager_time(fn, steps=3):
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


@torch.no_grad()
def measure(model, name, kind, cache, batch, context, graph=True):
    """Step, attention-only and eager step times (ms) of one cache. `graph=False` takes the eager step as the
    step (for a DynamicCache of many gigabytes: every layer's concatenation captured in one graph would keep
    a second copy of the whole cache in the graph's memory pool)."""
    text = model.config.get_text_config()
    q_heads, head_dim = text.num_attention_heads, cache_head_dim(text)
    ids = torch.full((batch, 1), 1000, dtype=torch.long, device="cuda")
    # A fixed position (the captured step's): RoPE and masks do not change what the step reads.
    position = torch.full((batch, 1), context, dtype=torch.long, device="cuda")
    cache_position = torch.tensor([context], dtype=torch.long, device="cuda")
    model.set_attn_implementation("sdpa" if kind == "sdpa" else fic.ATTENTION if kind == "flashinfer" else gt.ATTENTION)

    cache_kw = {gt.cache_argument(model): cache}

    def step():
        model(input_ids=ids, position_ids=position, cache_position=cache_position, use_cache=True, **cache_kw)

    # The capture counted one begin on the host; every replay after the first adds a token on the device.
    # (A FlashInferCache rewrites the same position each step: nothing to count.)
    on_replay = None if kind in ("sdpa", "flashinfer") else (lambda i: cache.note_replayed(1) if i > 0 else None)
    eager = eager_time(step)
    step_ms = graph_time(step, on_replay=on_replay) if graph else eager
    q = torch.randn((batch, q_heads, 1, head_dim), device="cuda").bfloat16()
    out = torch.empty_like(q)
    scale = softmax_scale(text)
    if kind == "sdpa":
        layers = [(l.keys, l.values) for l in cache.layers]
        def attend():
            for k, v in layers:
                F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
    elif kind == "flashinfer":
        q3 = q[:, :, 0].contiguous()
        def attend():
            for layer in range(text.num_hidden_layers):
                cache.attend_layer(layer, q3)
    else:
        def attend():
            s = torch.cuda.current_stream().cuda_stream
            for layer in range(text.num_hidden_layers):
                cache.kv.attend(layer, q, out, scale=scale, stream=s)
    attention_ms = graph_time(attend)
    if kind not in ("sdpa", "flashinfer"):
        cache.kv.check()
    return {"step_ms": step_ms, "attention_ms": attention_ms, "eager_step_ms": eager,
            "attention_share": attention_ms / step_ms, "step_timing": "graph" if graph else "eager"}


def cache_head_dim(text):
    return getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads


KINDS = ("gaac", "twin", "sdpa", "flashinfer")
SELECTED = set(KINDS)  # --kinds


def bf16_kinds():
    """The BF16 configurations this run measures beside gaac (those --kinds keeps; flashinfer where it imports)."""
    return tuple(k for k in KINDS[1:] if k in SELECTED and (k != "flashinfer" or flashinfer is not None))


def run_config(model, name, kv, table, batch, context):
    kinds = ("gaac",) + bf16_kinds()
    row = {"model": name, "batch": batch, "context": context}
    for kind in kinds:
        cache = None
        try:
            if kind == "sdpa":
                cache = dynamic_cache(model, kv, batch, context)
            elif kind == "flashinfer":
                cache = flashinfer_cache(model, kv, batch, context)
            else:
                cache = gaac_cache(model, kv, table, "gaac" if kind == "gaac" else "bf16", batch, context,
                                   device_budget(model, table, kind, batch, context))
            row[kind + "_bytes"] = cache_bytes(kind, cache)
            # A DynamicCache's step in a graph holds a second copy of the cache (see measure).
            graph = kind != "sdpa" or row[kind + "_bytes"] + 4 * 10**9 < torch.cuda.mem_get_info()[0]
            row[kind] = measure(model, name, kind, cache, batch, context, graph)
            if kind == "gaac":
                u = cache.usage()
                row["gaac_tiles"] = {"compressed": u["compressed_tiles"], "raw": u["raw_tiles"]}
        except Exception as e:  # recorded (a cache the device cannot hold, say), and the run goes on
            row[kind] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}", "step_ms": math.nan}
            log(f"[{name}] {kind} batch {batch} context {context}: {row[kind]['error']}")
        cache = None
        release()
    row["gaac_vs_twin"] = row["twin"]["step_ms"] / row["gaac"]["step_ms"] if "twin" in row else None
    row["gaac_vs_sdpa"] = row["sdpa"]["step_ms"] / row["gaac"]["step_ms"] if "sdpa" in row else None
    if "flashinfer" in row:
        row["gaac_vs_flashinfer"] = row["flashinfer"]["step_ms"] / row["gaac"]["step_ms"]
    log(json.dumps(row))
    return row


def device_budget(model, table, kind, batch, context):
    """None (the cache's worst case for its tokens) where the device has room for that; else what the device
    has free but 4 GB, so a cache that holds the sequences in less than its worst case still runs."""
    layers, kv_heads, head_dim, windows = gt._geometry(model.config)
    worst = gaac.KvCache.worst_case_budget(layers, kv_heads, head_dim, context + GROWTH, batch,
                                           table if kind == "gaac" else None, "gaac" if kind == "gaac" else "bf16",
                                           windows)
    free = torch.cuda.mem_get_info()[0]
    return None if worst < free - 4 * 10**9 else max(1, free - 4 * 10**9)


def release():
    """Frees the device memory of what the caller has just dropped (`del`): a GaacCache and its layers refer
    to each other, so only the garbage collector frees the cache (and its device budget); graphs' private
    pools go back with torch's cache."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def gaac_fits(model, kv, table, fmt, n, context, budget):
    """True when a `fmt` cache of `budget` bytes holds `n` sequences of `context` tokens and then grows by the
    GROWTH tokens of a measurement as decoding does (one attended token a step: sliding layers keep the blocks
    their queries see until the next step)."""
    fits = True
    try:
        cache = gaac_cache(model, kv, table, fmt, n, context, budget)
        stream = torch.cuda.current_stream().cuda_stream
        for step in range(GROWTH):
            cache.kv.begin(1, stream=stream)
            for layer, (k, v) in enumerate(kv):
                at = (context + step) % k.shape[2]
                cache.kv.write(layer, k[:, :, at:at + 1].expand(n, -1, -1, -1),
                               v[:, :, at:at + 1].expand(n, -1, -1, -1), stream)
        cache.kv.check()
        del cache
    except gaac.CacheFullError:
        fits = False
    release()  # after the except block: its traceback held the half-filled cache
    return fits


def most_sequences(model, kv, table, fmt, context, budget, estimate):
    """The most sequences a `fmt` cache of `budget` bytes holds, searched from `estimate` by filling caches."""
    n = max(1, estimate)
    if gaac_fits(model, kv, table, fmt, n, context, budget):
        while gaac_fits(model, kv, table, fmt, n + 1, context, budget):
            n += 1
        return n
    while n > 1:
        n -= 1
        if gaac_fits(model, kv, table, fmt, n, context, budget):
            return n
    return 0


def serving(model, name, kv, table, context, budget):
    """Same GPU, same KV memory: each cache holds as many sequences of `context` tokens as `budget` bytes
    take, and one decode step serves them all (the weights are read once for every sequence)."""
    layers, kv_heads, head_dim, windows = gt._geometry(model.config)
    tokens = context + GROWTH
    per_bf16 = gaac.KvCache.worst_case_budget(layers, kv_heads, head_dim, tokens, 1, None, "bf16", windows)
    twin_n = most_sequences(model, kv, table, "bf16", context, budget, budget // per_bf16) \
        if "twin" in bf16_kinds() else None
    # GAAC: a sequence's resident bytes, measured on one, give the first guess; filling decides.
    one = gaac_cache(model, kv, table, "gaac", 1, context)
    u = one.usage()
    per_gaac = u["resident_bytes"] * tokens / context
    raw_share = u["raw_tiles"] / max(1, u["raw_tiles"] + u["compressed_tiles"])
    del one
    release()
    gaac_n = most_sequences(model, kv, table, "gaac", context, budget, int(budget // per_gaac))
    sdpa_n = None
    if "sdpa" in bf16_kinds():
        probe = dynamic_cache(model, kv, 1, context)  # its sliding layers keep their window only
        sdpa_n = int(budget // cache_bytes("sdpa", probe))
        del probe
        release()
    counts = {k: n for k, n in (("gaac", gaac_n), ("twin", twin_n), ("sdpa", sdpa_n)) if n is not None}
    if "flashinfer" in bf16_kinds():  # its pages are plain tensors: counted, not filled
        counts["flashinfer"] = fic.FlashInferCache.sequences_in(budget, (layers, kv_heads, head_dim, windows),
                                                                context, GROWTH)
    row = {"model": name, "context": context, "budget_bytes": budget, "raw_tile_share": raw_share,
           "sequences": counts}
    for kind, n in counts.items():
        if n < 1:
            row[kind] = {"error": "no sequence fits the budget"}
            continue
        try:
            if kind == "sdpa":
                cache = dynamic_cache(model, kv, n, context)
            elif kind == "flashinfer":
                cache = flashinfer_cache(model, kv, n, context)
            else:
                cache = gaac_cache(model, kv, table, "gaac" if kind == "gaac" else "bf16", n, context, budget)
            # A DynamicCache's step in a graph holds a second copy of the cache (see measure).
            graph = kind != "sdpa" or cache_bytes(kind, cache) + 4 * 10**9 < torch.cuda.mem_get_info()[0]
            t = measure(model, name, kind, cache, n, context, graph)
            row[kind] = dict(t, tokens_per_s=n / (t["step_ms"] / 1e3), kv_bytes=cache_bytes(kind, cache))
        except Exception as e:  # recorded (an out-of-memory DynamicCache, say), and the run goes on
            row[kind] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
        cache = None
        release()
        log(f"[{name}] {budget / 1e9:.0f} GB, {context} tokens, {kind}: {n} sequences, {row[kind]}")
    best_bf16 = max((row[k].get("tokens_per_s", 0.0) for k in bf16_kinds()), default=0.0)
    row["gaac_vs_best_bf16_tokens_per_s"] = row["gaac"].get("tokens_per_s", math.nan) / best_bf16 if best_bf16 else None
    row["gaac_vs_twin_sequences"] = gaac_n / twin_n if twin_n else None
    if counts.get("flashinfer"):
        row["gaac_vs_flashinfer_sequences"] = gaac_n / counts["flashinfer"]
    log(json.dumps(row))
    return row


def parse_size(text):
    """Bytes of '40G', '2.5G', '800M' or a plain number (decimal units, as GPU memory is quoted); positive."""
    units = {"K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    body = text.strip().upper().removesuffix("B")
    try:
        value = float(body[:-1]) * units[body[-1]] if body and body[-1] in units else float(body)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 40G, 800M)") from None
    if not math.isfinite(value) or value < 1:
        raise argparse.ArgumentTypeError(f"a size must be at least one byte: {text!r}")
    return int(value)


def positive_ints(text):
    """A comma-separated list of positive integers (contexts, batch sizes)."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"every value must be positive: {text!r}")
    return values


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", help="directory of the GGUF files (smollm2, gemma3)")
    ap.add_argument("--hf-models", help="directory of the same models saved by save_pretrained (one folder per GGUF "
                    "file name), used when present")
    ap.add_argument("--model-path", action="append", default=[],
                    help="a transformers model directory of your own (repeatable); its name is the folder's")
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="smollm2,gemma3,llama8b",
                    help=f"models, of: {', '.join(CONTEXTS)} (with --model-path: those only, unless given)")
    ap.add_argument("--experiments", default="equal-batch,serving", help="equal-batch, serving, or both")
    ap.add_argument("--quick", action="store_true", help="equal batch: the shortest and longest context only")
    ap.add_argument("--budgets", type=lambda t: [parse_size(b) for b in t.split(",")],
                    help="serving: KV budgets, e.g. 40G,100G (default: the model's in SERVING_BUDGETS)")
    ap.add_argument("--contexts", type=positive_ints, help="serving: contexts in tokens (default: " +
                    ",".join(map(str, SERVING_CONTEXTS)) + "); equal batch: instead of the model's own")
    ap.add_argument("--batches", type=positive_ints, help="equal batch: batch sizes instead of the model's own")
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help="the caches to measure, of: " + ", ".join(KINDS) + " (gaac always)")
    args = ap.parse_args()
    unknown = set(args.kinds.split(",")) - set(KINDS)
    if unknown:
        ap.error(f"--kinds: unknown {', '.join(sorted(unknown))}")
    SELECTED.clear()
    SELECTED.update(args.kinds.split(","), {"gaac"})
    experiments = set(args.experiments.split(","))
    if experiments - {"equal-batch", "serving"}:
        ap.error(f"--experiments: unknown {', '.join(experiments - {'equal-batch', 'serving'})}")
    names = args.only.split(",") if args.only and (not args.model_path or "--only" in sys.argv) else []
    unknown = [m for m in names if m not in CONTEXTS]
    if unknown:
        ap.error(f"--only: unknown model(s) {', '.join(unknown)} (known: {', '.join(CONTEXTS)})")
    if any(m in GGUF for m in names) and not args.models:
        ap.error("--models DIR is needed for " + ", ".join(m for m in names if m in GGUF))
    torch.backends.cuda.matmul.allow_tf32 = False
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "transformers": __import__("transformers").__version__,
               "flashinfer": getattr(flashinfer, "__version__", None), "equal_batch": [], "serving": []}
    log(f"flashinfer {results['flashinfer']}" if flashinfer is not None else
        f"flashinfer not measured: {FLASHINFER_MISSING}")
    for name in names + args.model_path:
        model = load_model(name, args.models, args.hf_models)
        if name in args.model_path:
            name = pathlib.Path(name).name
        contexts = args.contexts or CONTEXTS.get(name, SERVING_CONTEXTS)
        batch_sizes = args.batches or BATCHES.get(name, [1, 8])
        batch_contexts = contexts[::max(1, len(contexts) - 1)] if args.quick else contexts
        serving_contexts = args.contexts or SERVING_CONTEXTS
        budgets = args.budgets or SERVING_BUDGETS.get(name, [20 * 10**9])
        longest = max((batch_contexts if "equal-batch" in experiments else []) +
                      (serving_contexts if "serving" in experiments else []))
        ids = prompt_ids(name, model, args.models, longest + 2 * GROWTH)
        t0 = time.time()
        kv = prefill(model, ids)
        torch.cuda.synchronize()
        log(f"[{name}] prefill of {longest} tokens: {time.time() - t0:.1f} s")
        # Windows learnt on 4096 positions spread over the whole prompt (the first positions alone leave
        # far more raw tiles at long context; docs/performance.md, "Where calibration looks").
        table = gt.calibrate_kv([k for k, _ in kv], [v for _, v in kv], sample_tokens=4096)
        if "equal-batch" in experiments:
            for context in batch_contexts:
                for batch in batch_sizes:
                    results["equal_batch"].append(run_config(model, name, kv, table, batch, context))
                    pathlib.Path(args.out).write_text(json.dumps(results, indent=1))
        if "serving" in experiments:
            for budget in budgets:
                for context in serving_contexts:
                    results["serving"].append(serving(model, name, kv, table, context, budget))
                    pathlib.Path(args.out).write_text(json.dumps(results, indent=1))
        del model, kv, table
        release()
    pathlib.Path(args.out).write_text(json.dumps(results, indent=1))
    print_serving_table(results["serving"])


def print_serving_table(rows):
    """The serving rows as a Markdown table."""
    if not rows:
        return
    kinds = ("gaac",) + bf16_kinds()
    names = " / ".join(kinds)
    log(f"\n| model | KV budget | context | sequences {names} | step ms {names} | tokens/s {names} | "
        f"attention share {names} | gaac / best BF16 tokens/s | raw tiles |")
    log("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        num = lambda k, f, fmt: format(r[k][f], fmt) if k in r and f in r[k] else "–"
        log(f"| {r['model']} | {r['budget_bytes'] / 1e9:g} GB | {r['context']} | "
            + " / ".join(str(r["sequences"].get(k, "–")) for k in kinds) + " | "
            + " / ".join(num(k, "step_ms", ".2f") for k in kinds) + " | "
            + " / ".join(num(k, "tokens_per_s", ".0f") for k in kinds) + " | "
            + " / ".join(num(k, "attention_share", ".0%") for k in kinds) + " | "
            + (f"{r['gaac_vs_best_bf16_tokens_per_s']:.2f}×" if r["gaac_vs_best_bf16_tokens_per_s"] else "–")
            + f" | {r['raw_tile_share']:.2%} |")


if __name__ == "__main__":
    sys.exit(main())
