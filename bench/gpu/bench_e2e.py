#!/usr/bin/env python3
"""End-to-end decoding on a GPU with transformers: whole decode steps of real models (SmolLM2-135M and Gemma 3
270M from our GGUF files) and of a model with Llama-3.1-8B's geometry (random bf16 weights: timing only), over
three caches in one process:

  gaac     GaacCache(device="cuda"): compressed tiles on the device, GPU finalize, the fused kernel
  twin     GaacCache(cache_format="bf16"): the same structure and kernel over BF16 tiles
  sdpa     transformers' DynamicCache with its SDPA attention

Every decoding step is captured in a CUDA graph (torch.cuda.CUDAGraph around one model forward: static input
ids and positions; gaac's kernels do no host sync and no allocation) and replayed; the step time is the median
of the replays, each between two CUDA events. Each replay is a real step: the gaac caches grow by one token a
replay (plans made for the longest length reached), DynamicCache concatenates as it does eagerly. Beside each
step, the same graph of the attention calls alone (all layers, same cache) gives the share of the step that
reads KV, and one eager step is timed for the overhead that graphs remove.

Experiments:
  equal-batch   step latency at batch 1 and 8 from 4K to each model's limit (8B: batch 1, 32K-128K)
  equal-memory  for a fixed KV budget, the most sequences each cache holds at the context and their tokens/s

The prompt of each model (SmolLM2: a text; Gemma 3 and the 8B geometry: seeded random token ids) is filled once
by a batch-1 prefill (SDPA, every layer kept whole) and copied into
every sequence of a batch; the gaac caches are filled from it on the device (begin, write, finalize).

  python3 bench/gpu/bench_e2e.py --models DIR [--hf-models DIR] --out results.json [--only smollm2,gemma3,llama8b]
      [--quick] [--skip-equal-memory]
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

ROOT = pathlib.Path(__file__).resolve().parents[2]
GGUF = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf"}
CONTEXTS = {"smollm2": [4096, 8192], "gemma3": [4096, 8192, 16384, 32768], "llama8b": [32768, 65536, 131072]}
BATCHES = {"smollm2": [1, 8], "gemma3": [1, 8], "llama8b": [1]}
# (model, context, KV budget in bytes): the paper's Llama-3.1-8B row (64K, 18 GB) and Gemma 3 at its limit.
EQUAL_MEMORY = [("llama8b", 65536, 18 * 10**9), ("gemma3", 32768, 2 * 10**9)]
REPLAYS = 30
FILL_CHUNK = 4096  # tokens written into a gaac cache per begin when filling it from a prefill
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
        top = 20000 if name == "gemma3" else 100000
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
    model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
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
        cache.kv.begin(n, stream=stream)
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


def cache_bytes(kind, cache):
    if kind == "sdpa":
        return sum(l.keys.nbytes + l.values.nbytes for l in cache.layers)
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
def measure(model, name, kind, cache, batch, context):
    """Step, attention-only and eager step times (ms) of one cache."""
    text = model.config.get_text_config()
    q_heads, head_dim = text.num_attention_heads, cache_head_dim(text)
    ids = torch.full((batch, 1), 1000, dtype=torch.long, device="cuda")
    # A fixed position (the captured step's): RoPE and masks do not change what the step reads.
    position = torch.full((batch, 1), context, dtype=torch.long, device="cuda")
    cache_position = torch.tensor([context], dtype=torch.long, device="cuda")
    model.set_attn_implementation("sdpa" if kind == "sdpa" else gt.ATTENTION)

    def step():
        model(input_ids=ids, position_ids=position, cache_position=cache_position, past_key_values=cache,
              use_cache=True)

    # The capture counted one begin on the host; every replay after the first adds a token on the device.
    on_replay = None if kind == "sdpa" else (lambda i: cache.note_replayed(1) if i > 0 else None)
    eager = eager_time(step)
    step_ms = graph_time(step, on_replay=on_replay)
    q = torch.randn((batch, q_heads, 1, head_dim), device="cuda").bfloat16()
    out = torch.empty_like(q)
    scale = getattr(text, "query_pre_attn_scalar", None)
    scale = scale ** -0.5 if scale else head_dim ** -0.5
    if kind == "sdpa":
        layers = [(l.keys, l.values) for l in cache.layers]
        def attend():
            for k, v in layers:
                F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
    else:
        def attend():
            s = torch.cuda.current_stream().cuda_stream
            for layer in range(text.num_hidden_layers):
                cache.kv.attend(layer, q, out, scale=scale, stream=s)
    attention_ms = graph_time(attend)
    if kind != "sdpa":
        cache.kv.check()
    return {"step_ms": step_ms, "attention_ms": attention_ms, "eager_step_ms": eager,
            "attention_share": attention_ms / step_ms}


def cache_head_dim(text):
    return getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads


def run_config(model, name, kv, table, batch, context, budget=None, kinds=("gaac", "twin", "sdpa")):
    row = {"model": name, "batch": batch, "context": context}
    for kind in kinds:
        torch.cuda.empty_cache()
        if kind == "sdpa":
            cache = dynamic_cache(model, kv, batch, context)
        else:
            cache = gaac_cache(model, kv, table, "gaac" if kind == "gaac" else "bf16", batch, context, budget)
        row[kind + "_bytes"] = cache_bytes(kind, cache)
        try:
            row[kind] = measure(model, name, kind, cache, batch, context)
        except Exception as e:  # recorded, and the run goes on
            row[kind] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0]}", "step_ms": math.nan}
            log(f"[{name}] {kind} batch {batch} context {context}: {row[kind]['error']}")
        if kind == "gaac":
            u = cache.usage()
            row["gaac_tiles"] = {"compressed": u["compressed_tiles"], "raw": u["raw_tiles"]}
        del cache
    row["gaac_vs_twin"] = row["twin"]["step_ms"] / row["gaac"]["step_ms"] if "twin" in row else None
    row["gaac_vs_sdpa"] = row["sdpa"]["step_ms"] / row["gaac"]["step_ms"] if "sdpa" in row else None
    log(json.dumps(row))
    return row


def most_sequences(model, kv, table, fmt, context, budget, start):
    """The most sequences of context + GROWTH tokens a `fmt` cache of `budget` bytes holds, from `start` up."""
    n, best = start, 0
    while True:
        try:
            torch.cuda.empty_cache()
            cache = gaac_cache(model, kv, table, fmt, n, context + GROWTH, budget)
            del cache
            best, n = n, n + 1
        except gaac.GaacError:  # CacheFullError, or a table without rows for them
            if n == start and start > 1:
                n, start = n - 1, n - 1
                continue
            return best


def equal_memory(model, name, kv, table, context, budget):
    layers, kv_heads, head_dim, windows = gt._geometry(model.config)
    # BF16: the exact count (its tiles never change size); GAAC: measured by filling.
    per_seq = gaac.KvCache.worst_case_budget(layers, kv_heads, head_dim, context + GROWTH, 1, None, "bf16", windows)
    twin_n = most_sequences(model, kv, table, "bf16", context, budget, max(1, budget // per_seq))
    gaac_n = most_sequences(model, kv, table, "gaac", context, budget, max(1, twin_n))
    one = dynamic_cache(model, kv, 1, context)  # its sliding layers keep their window only
    bf16_n = budget // cache_bytes("sdpa", one)
    del one
    row = {"model": name, "context": context, "budget_bytes": budget, "twin_sequences": twin_n,
           "gaac_sequences": gaac_n, "sdpa_sequences_by_bytes": bf16_n}
    for kind, n in (("gaac", gaac_n), ("twin", twin_n)):
        cache = gaac_cache(model, kv, table, "gaac" if kind == "gaac" else "bf16", n, context, budget)
        t = measure(model, name, kind, cache, n, context)
        row[kind] = dict(t, tokens_per_s=n / (t["step_ms"] / 1e3), resident_bytes=cache_bytes(kind, cache))
        del cache
    if bf16_n >= 1:
        cache = dynamic_cache(model, kv, bf16_n, context)
        t = measure(model, name, "sdpa", cache, bf16_n, context)
        row["sdpa"] = dict(t, tokens_per_s=bf16_n / (t["step_ms"] / 1e3))
        del cache
    row["gain_vs_twin"] = row["gaac"]["tokens_per_s"] / row["twin"]["tokens_per_s"]
    log(json.dumps(row))
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", required=True, help="directory of the GGUF files")
    ap.add_argument("--hf-models", help="directory of the same models saved by save_pretrained (one folder per GGUF "
                    "file name), used when present")
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="smollm2,gemma3,llama8b")
    ap.add_argument("--quick", action="store_true", help="the shortest and longest context of each model only")
    ap.add_argument("--skip-equal-memory", action="store_true")
    ap.add_argument("--skip-equal-batch", action="store_true")
    args = ap.parse_args()
    unknown = [m for m in args.only.split(",") if m not in CONTEXTS]
    if unknown:
        ap.error(f"--only: unknown model(s) {', '.join(unknown)} (known: {', '.join(CONTEXTS)})")
    torch.backends.cuda.matmul.allow_tf32 = False
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "transformers": __import__("transformers").__version__, "equal_batch": [], "equal_memory": []}
    for name in args.only.split(","):
        model = load_model(name, args.models, args.hf_models)
        contexts = CONTEXTS[name][::len(CONTEXTS[name]) - 1] if args.quick else CONTEXTS[name]
        longest = max(contexts)
        if not args.skip_equal_memory:
            longest = max([longest] + [c for m, c, _ in EQUAL_MEMORY if m == name])
        ids = prompt_ids(name, model, args.models, longest + 2 * GROWTH)
        t0 = time.time()
        kv = prefill(model, ids)
        torch.cuda.synchronize()
        log(f"[{name}] prefill of {longest} tokens: {time.time() - t0:.1f} s")
        # Windows learnt on 4096 positions spread over the whole prompt (the first positions alone leave
        # far more raw tiles at long context; docs/performance.md, "Where calibration looks").
        table = gt.calibrate_kv([k for k, _ in kv], [v for _, v in kv], sample_tokens=4096)
        for context in [] if args.skip_equal_batch else contexts:
            for batch in BATCHES[name]:
                results["equal_batch"].append(run_config(model, name, kv, table, batch, context))
        if not args.skip_equal_memory:
            for m, context, budget in EQUAL_MEMORY:
                if m == name:
                    results["equal_memory"].append(equal_memory(model, name, kv, table, context, budget))
        pathlib.Path(args.out).write_text(json.dumps(results, indent=1))
        del model, kv
        torch.cuda.empty_cache()
    pathlib.Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.exit(main())
