#!/usr/bin/env python3
"""Reference logits and greedy tokens from llama.cpp, for validating gaac's engine.

Runs llama.cpp (through the llama-cpp-python package from PyPI, which builds llama.cpp from its public
source; install it in a virtual environment: `python3 -m venv /tmp/venv && /tmp/venv/bin/pip install
llama-cpp-python==0.3.36 numpy`) with a BF16 KV cache. Nothing of llama.cpp is part of gaac.

  reference_logits.py logits MODEL.gguf TOKENS.txt OUT.f32
      evaluates the token ids in TOKENS.txt (whitespace-separated, as written by
      `gaac validate --write-tokens`) and writes their logits as raw little-endian float32,
      n_tokens × vocab, for `gaac validate --reference OUT.f32`.
  reference_logits.py greedy MODEL.gguf TOKENS.txt N
      prints the first N greedy (arg-max) continuation token ids of the token ids in TOKENS.txt.
  reference_logits.py prefill MODEL.gguf TOKENS.txt [KV [THREADS]]
      times llama.cpp's prefill of the token ids with its own defaults (micro-batches of 512, weights
      repacked where it does so, flash attention) and a KV cache of type KV: bf16 (the default; the cache
      whose arithmetic gaac's engine follows) or f16 (llama.cpp's own default type, which its tiled
      prefill attention takes), on THREADS threads (default 2): the peer of gaac's prefill in
      docs/performance.md. Prints one JSON line.
  reference_logits.py decode MODEL.gguf TOKENS.txt FEED.txt
      prefills the token ids (llama.cpp's defaults), then times decoding steps of one token each, feeding
      the ids of FEED.txt in turn (gaac's greedy continuation, so both engines do the same work): the
      peer of `gaac generate`'s decode speed in docs/performance.md. Prints one JSON line.
"""

import json
import sys
import time

import numpy as np
import llama_cpp.llama_cpp as llama_cpp  # the bindings module the Llama class reads its defaults from
from llama_cpp import Llama

GGML_TYPE_F16 = 1
GGML_TYPE_BF16 = 30
KV_TYPES = {"bf16": GGML_TYPE_BF16, "f16": GGML_TYPE_F16}
# llama.cpp's CPU backend multiplies K-quant weights (Q4_K, Q6_K) by micro-batches of eight or more tokens
# with another kernel, whose float sums are ordered differently (a few ulps apart). Micro-batches of four
# tokens keep it on ggml's plain dot products, the arithmetic gaac's engine follows.
MICRO_BATCH = 4


def _plain_weight_params(default_params=llama_cpp.llama_model_default_params):
    # By default llama.cpp repacks some weight types (Q4_K, Q8_0, ...) into interleaved layouts whose
    # matrix kernels add the same products in another order. The reference keeps the weights as stored,
    # so its dot products are ggml's plain ones, the arithmetic gaac's engine follows.
    params = default_params()
    params.use_extra_bufts = False
    return params


def load(model, n_ctx, exact=True, kv_type=GGML_TYPE_BF16, threads=2):
    """llama.cpp with a BF16 (or `kv_type`) KV cache and flash attention; `exact`: on ggml's plain kernels (see above)."""
    default_params = llama_cpp.llama_model_default_params
    if exact:
        llama_cpp.llama_model_default_params = lambda: _plain_weight_params(default_params)
    try:
        batch = MICRO_BATCH if exact else 512
        return Llama(model_path=model, n_ctx=n_ctx, n_batch=batch, n_ubatch=batch, logits_all=exact, n_threads=threads,
                     n_threads_batch=threads, verbose=False, type_k=kv_type, type_v=kv_type, flash_attn=True)
    finally:
        llama_cpp.llama_model_default_params = default_params


def read_tokens(path):
    with open(path) as f:
        return [int(t) for t in f.read().split()]


def main():
    mode, model, tokens_path = sys.argv[1:4]
    tokens = read_tokens(tokens_path)
    if mode == "logits":
        llm = load(model, len(tokens) + 8)
        llm.eval(tokens)
        scores = np.asarray(llm.scores[: len(tokens)], dtype="<f4")
        scores.tofile(sys.argv[4])
        print(f"{len(tokens)} positions x {scores.shape[1]} logits written to {sys.argv[4]}", file=sys.stderr)
    elif mode == "greedy":
        n = int(sys.argv[4])
        llm = load(model, len(tokens) + n + 8)
        llm.eval(tokens)
        out = []
        for _ in range(n):
            nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            out.append(nxt)
            llm.eval([nxt])
        print(" ".join(map(str, out)))
    elif mode == "prefill":
        kv = sys.argv[4] if len(sys.argv) > 4 else "bf16"
        threads = int(sys.argv[5]) if len(sys.argv) > 5 else 2
        if kv not in KV_TYPES:
            sys.exit(f"KV type {kv!r}: expected one of {', '.join(KV_TYPES)}")
        llm = load(model, len(tokens) + 8, exact=False, kv_type=KV_TYPES[kv], threads=threads)
        start = time.perf_counter()
        llm.eval(tokens)
        seconds = time.perf_counter() - start
        print(json.dumps({"engine": "llama.cpp", "kv": kv, "threads": threads, "prompt_tokens": len(tokens),
                          "prompt_seconds": seconds, "prompt_tokens_per_s": len(tokens) / seconds}))
    elif mode == "decode":
        feed = read_tokens(sys.argv[4])
        n = len(feed)
        llm = load(model, len(tokens) + n + 8, exact=False)
        llm.eval(tokens)
        start = time.time()
        for token in feed:
            llm.eval([token])
        seconds = time.time() - start
        print(json.dumps({"engine": "llama.cpp", "context_tokens": len(tokens), "decode_tokens": n,
                          "decode_tokens_per_s": n / seconds}))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
