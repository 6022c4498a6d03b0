"""gaac.transformers: greedy generation with GaacCache over compressed tiles gives the same tokens as the same
attention code over the BF16 twin, bit for bit, on the real models loaded by transformers from our GGUF files;
the first difference from transformers' own DynamicCache + SDPA is reported (they sum in another order).

The same on a GPU (GaacCache(device="cuda"): the device cache, GPU finalize and the fused kernel) where CUDA is
present. Needs torch, transformers, gguf and accelerate (skipped without them unless GAAC_REQUIRE_TRANSFORMERS=1) and
the models (scripts/fetch_models.py). Gemma 3 takes minutes on a small CPU: it runs with GAAC_SLOW_TESTS=1.
"""
import contextlib
import functools
import os
import pathlib

import pytest

REQUIRED = os.environ.get("GAAC_REQUIRE_TRANSFORMERS") == "1"
MODELS = pathlib.Path(os.environ.get("GAAC_MODEL_DIR", pathlib.Path.home() / ".cache" / "gaac" / "models"))
ROOT = pathlib.Path(__file__).resolve().parents[2]


def need_module(name):
    try:
        return __import__(name)
    except ImportError:
        if REQUIRED:
            pytest.fail(f"{name} is not installed (GAAC_REQUIRE_TRANSFORMERS=1)")
        pytest.skip(f"{name} is not installed")


def load(gguf_file):
    torch = need_module("torch")
    for name in ("transformers", "gguf", "accelerate"):
        need_module(name)
    if not (MODELS / gguf_file).is_file():
        if REQUIRED:
            pytest.fail(f"no model {MODELS / gguf_file} (scripts/fetch_models.py)")
        pytest.skip(f"no model {MODELS / gguf_file}")
    import gaac.transformers as gt

    return torch, gt, loaded_model(gguf_file)


@functools.lru_cache(maxsize=None)
def loaded_model(gguf_file):
    """The model, loaded once per module (tens of seconds on a small CPU); every test leaves it as it found it:
    on the CPU, attended by gaac's attention function."""
    import torch
    from transformers import AutoModelForCausalLM

    import gaac.transformers as gt

    converted = os.environ.get("GAAC_HF_MODELS")  # the same weights saved by save_pretrained (loads in seconds)
    if converted and (pathlib.Path(converted) / gguf_file).is_dir():
        return AutoModelForCausalLM.from_pretrained(pathlib.Path(converted) / gguf_file, dtype=torch.bfloat16,
                                                    attn_implementation=gt.ATTENTION)
    return AutoModelForCausalLM.from_pretrained(MODELS, gguf_file=gguf_file, dtype=torch.bfloat16,
                                                attn_implementation=gt.ATTENTION)


def need_gpu(torch):
    import gaac

    if not (gaac.cuda_available() and torch.cuda.is_available()):
        pytest.skip("no CUDA device (or gaac built without CUDA)")


def generate(model, *args, cache=None, **kwargs):
    """model.generate with `cache` under the keyword the installed transformers takes (gt.cache_argument)."""
    import gaac.transformers as gt

    if cache is not None:
        kwargs[gt.cache_argument(model)] = cache
    return model.generate(*args, **kwargs)


def forward(model, cache=None, **kwargs):
    """model(...) with `cache` under the keyword the installed transformers takes."""
    import gaac.transformers as gt

    if cache is not None:
        kwargs[gt.cache_argument(model)] = cache
    return model(**kwargs)


def generate_three_ways(torch, gt, model, prompt_ids, calibration_ids, tokens, device="cpu"):
    from transformers import DynamicCache

    model.to(device)
    try:
        prompt_ids, calibration_ids = prompt_ids.to(device), calibration_ids.to(device)
        table = gt.calibrate(model, calibration_ids)
        out = {}
        for fmt in ("gaac", "bf16"):
            # On a GPU both caches get the same split of the context, so that their attention sums in one order.
            cache = gt.GaacCache(model.config, table, max_tokens=prompt_ids.shape[1] + tokens,
                                 batch=prompt_ids.shape[0], cache_format=fmt, device=device, blocks_per_split=4)
            ids = generate(model, prompt_ids, cache=cache, max_new_tokens=tokens, do_sample=False)
            out[fmt] = ids[:, prompt_ids.shape[1]:].tolist()
            out[fmt + "_usage"] = cache.usage()
        model.set_attn_implementation("sdpa")
        ids = generate(model, prompt_ids, cache=DynamicCache(config=model.config), max_new_tokens=tokens,
                       do_sample=False)
        out["sdpa"] = ids[:, prompt_ids.shape[1]:].tolist()
        return out
    finally:  # as it was found: a loaded model is shared by the module's tests
        model.set_attn_implementation(gt.ATTENTION)
        model.to("cpu")


def report(name, out):
    for b, (sdpa, ours) in enumerate(zip(out["sdpa"], out["gaac"])):
        first = next((i for i, (x, y) in enumerate(zip(sdpa, ours)) if x != y), None)
        u = out["gaac_usage"]
        print(f"[{name}, sequence {b}] GaacCache tokens = BF16 twin's ({len(ours)}); DynamicCache + SDPA "
              f"{'agrees on every token' if first is None else f'first differs at generated token {first}'}; "
              f"GAAC cache {u['compressed_tiles']} compressed / {u['raw_tiles']} raw / "
              f"{u.get('tail_tiles', 'its raw count includes the')} open tiles")


def random_model(arch, device):
    """A small model of a real architecture with seeded random weights: the whole integration (updates,
    attention, sliding windows, GQA) without model files. Llama: 9 query heads over 3 KV heads of 64 (SmolLM2's
    shape); Gemma 3: 4 over 1 of 256, sliding windows of 32 tokens on five layers of six."""
    torch = need_module("torch")
    need_module("transformers")
    import transformers

    import gaac.transformers as gt

    torch.manual_seed(0)
    if arch == "llama":
        config = transformers.LlamaConfig(vocab_size=512, hidden_size=576, intermediate_size=768, num_hidden_layers=3,
                                          num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                                          max_position_embeddings=1024)
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.Gemma3TextConfig(vocab_size=512, hidden_size=256, intermediate_size=512,
                                               num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1,
                                               head_dim=256, sliding_window=32, max_position_embeddings=1024)
        model = transformers.Gemma3ForCausalLM(config)
    model = model.to(device=device, dtype=torch.bfloat16).eval()
    model.set_attn_implementation(gt.ATTENTION)
    return torch, gt, model


def test_a_dropped_cache_is_freed_at_once():
    """No reference cycle between a GaacCache and its layers: the last `del` frees it (and its budget's memory)
    without waiting for the garbage collector."""
    import gc
    import weakref

    torch, gt, model = random_model("llama", "cpu")
    calibration = torch.randint(3, 512, (1, 64), generator=torch.Generator().manual_seed(2))
    cache = gt.GaacCache(model.config, gt.calibrate(model, calibration), max_tokens=64)
    generate(model, calibration[:, :20], cache=cache, max_new_tokens=3, do_sample=False, pad_token_id=0)
    alive = weakref.ref(cache)
    gc.disable()
    try:
        del cache
        assert alive() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_random_models_gaac_equals_bf16_twin(arch, device):
    """Random weights of both architectures: a batch of two 100-token prompts and 40 new tokens (past the
    sliding window), the same tokens from a GAAC cache and its BF16 twin, on the CPU and on a GPU."""
    torch, gt, model = random_model(arch, "cpu")
    if device == "cuda":
        need_gpu(torch)
    prompts = torch.randint(3, 512, (2, 100), generator=torch.Generator().manual_seed(1))
    calibration = torch.randint(3, 512, (1, 300), generator=torch.Generator().manual_seed(2))
    out = generate_three_ways(torch, gt, model, prompts, calibration, 40, device=device)
    assert out["gaac"] == out["bf16"]
    assert out["gaac_usage"]["compressed_tiles"] > 0
    report(f"random {arch} on {device}", out)


def test_smollm2_gaac_equals_bf16_twin():
    torch, gt, model = load("SmolLM2-135M-Instruct.Q4_1.gguf")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODELS, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    text = (ROOT / "data" / "calibration_text.txt").read_text()
    calibration_ids = tok(text, return_tensors="pt").input_ids[:, :512]
    prompt = tok("The history of the printing press begins in", return_tensors="pt").input_ids
    out = generate_three_ways(torch, gt, model, prompt, calibration_ids, 40)  # 49 tokens: two blocks finalized
    assert out["gaac"] == out["bf16"]
    assert out["gaac_usage"]["compressed_tiles"] > 0
    report("SmolLM2", out)


def test_smollm2_gpu_gaac_equals_bf16_twin():
    """On the GPU, a batch of two 300-token prompts and 70 new tokens: device finalize, fused kernel."""
    need_gpu(need_module("torch"))  # before the model's load: half a minute on a small CPU
    torch, gt, model = load("SmolLM2-135M-Instruct.Q4_1.gguf")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODELS, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    ids = tok((ROOT / "data" / "calibration_text.txt").read_text(), return_tensors="pt").input_ids
    prompts = torch.cat([ids[:, 512:812], ids[:, 900:1200]])
    out = generate_three_ways(torch, gt, model, prompts, ids[:, :512], 70, device="cuda")
    assert out["gaac"] == out["bf16"]
    assert out["gaac_usage"]["compressed_tiles"] > 0
    report("SmolLM2 GPU", out)


def test_smollm2_second_turn_reads_the_cache():
    """A second prompt on a cache that already holds a conversation: its tokens attend to the cache and to
    each other through gaac.attend; GAAC and the BF16 twin still give the same tokens."""
    torch, gt, model = load("SmolLM2-135M-Instruct.Q4_1.gguf")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODELS, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    table = gt.calibrate(model, tok((ROOT / "data" / "calibration_text.txt").read_text(),
                                    return_tensors="pt").input_ids[:, :512])
    first = tok("Name three rivers in Europe:", return_tensors="pt").input_ids
    second = tok(" Now name three mountains:", return_tensors="pt").input_ids
    tokens = {}
    for fmt in ("gaac", "bf16"):
        cache = gt.GaacCache(model.config, table, max_tokens=128, cache_format=fmt)
        ids = generate(model, first, cache=cache, max_new_tokens=12, do_sample=False)
        ids = generate(model, torch.cat([ids, second], dim=1), cache=cache, max_new_tokens=12,
                             do_sample=False)
        tokens[fmt] = ids[0].tolist()
        assert cache.get_seq_length() == ids.shape[1] - 1  # every token forwarded: all but the last generated
    assert tokens["gaac"] == tokens["bf16"]


@pytest.mark.skipif(os.environ.get("GAAC_SLOW_TESTS") != "1", reason="minutes on a small CPU: GAAC_SLOW_TESTS=1")
def test_gemma3_gaac_equals_bf16_twin_with_sliding_windows():
    torch, gt, model = load("gemma-3-270m-q4_k_m.gguf")
    assert 512 in gt._geometry(model.config)[3]  # sliding-window layers
    # transformers' GGUF tokenizer for Gemma 3 is not the model's: token ids as gaac's tokenizer makes them.
    prompt = torch.tensor([[2, 818, 3925, 529, 506, 19283, 3543, 11979, 528]])
    calibration_ids = torch.randint(100, 20000, (1, 700), generator=torch.Generator().manual_seed(0))
    out = generate_three_ways(torch, gt, model, prompt, calibration_ids, 30)
    assert out["gaac"] == out["bf16"]
    report("Gemma 3", out)


def test_gemma3_gpu_gaac_equals_bf16_twin_with_sliding_windows():
    """On the GPU, 600 prompt tokens and 40 new ones: past Gemma 3's 512-token window, so its sliding layers release
    blocks on the device."""
    need_gpu(need_module("torch"))  # before the model's load
    torch, gt, model = load("gemma-3-270m-q4_k_m.gguf")
    ids = torch.randint(100, 20000, (1, 1300), generator=torch.Generator().manual_seed(0))
    out = generate_three_ways(torch, gt, model, ids[:, 700:], ids[:, :700], 40, device="cuda")
    assert out["gaac"] == out["bf16"]
    report("Gemma 3 GPU", out)


# ---------------------------------------------------------------------------------------------------------------
# Every generate mode on both real models, each compared with the BF16 twin (same structure, same attention code):
# the tokens must be equal. Short prompts and few new tokens keep them quick on a small CPU. On a GPU the same, and
# on random weights of both architectures too (no model files needed; Gemma 3's 32-token windows are passed).

REAL_MODELS = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"]
RANDOM_MODELS = ["random-llama", "random-gemma3"]
MODES = ([pytest.param(name, "cpu", id=f"{name}-cpu") for name in REAL_MODELS] +
         [pytest.param(name, "cuda", id=f"{name}-cuda") for name in REAL_MODELS + RANDOM_MODELS])


@functools.lru_cache(maxsize=None)
def real_model(name):
    """The model, its calibration and three prompts of different lengths (token ids), loaded once per module."""
    if name.startswith("random-"):  # prompts longer than the random Gemma 3's 32-token window
        torch, gt, model = random_model(name[len("random-"):], "cpu")
        generator = torch.Generator().manual_seed(7)
        calibration_ids = torch.randint(3, 512, (1, 300), generator=generator)
        ids = torch.randint(3, 512, (104,), generator=generator).tolist()
        prompts = [ids[:45], ids[45:66], ids[66:]]
    else:
        torch, gt, model = load(name)
    model.eval()
    if name.startswith("SmolLM2"):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(MODELS, gguf_file=name)
        calibration_ids = tok((ROOT / "data" / "calibration_text.txt").read_text(), return_tensors="pt").input_ids
        texts = ["The history of the printing press begins in", "Rivers of Europe:", "Water boils at a temperature of"]
        prompts = [tok(t).input_ids for t in texts]
    elif name.startswith("gemma"):  # transformers' GGUF tokenizer for Gemma 3 is not the model's: gaac's ids
        calibration_ids = torch.randint(100, 20000, (1, 700), generator=torch.Generator().manual_seed(0))
        prompts = [[2, 818, 3925, 529, 506, 19283, 3543, 11979, 528], [2, 818, 3925, 529], [2, 19283, 3543, 11979]]
    table = gt.calibrate(model, calibration_ids[:, :512])
    return torch, gt, model, table, prompts


def mode_model(name, device):
    """real_model(name), skipping a GPU run without a GPU before anything is loaded."""
    if device == "cuda":
        need_gpu(need_module("torch"))
    return real_model(name)


@contextlib.contextmanager
def placed(model, device):
    """The model on `device` for the block, back on the CPU after it (the loaded models are shared)."""
    model.to(device)
    try:
        yield
    finally:
        model.to("cpu")


def left_padded(torch, prompts, pad=0, device="cpu"):
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    return ids, mask


def cache_for(gt, model, table, device, **kwargs):
    """A GaacCache on `device`; on a GPU with a fixed split of the context, so that a GAAC cache and its twin sum
    their attention in one order."""
    return gt.GaacCache(model.config, table, device=device, blocks_per_split=4 if device == "cuda" else 0, **kwargs)


def twins(gt, model, table, run, max_tokens=128, batch=1, device="cpu"):
    """run(cache) for a GAAC cache and its BF16 twin; returns both results."""
    return [run(cache_for(gt, model, table, device, max_tokens=max_tokens, batch=batch, cache_format=fmt))
            for fmt in ("gaac", "bf16")]


def new_tokens(ids, prompt_width):
    return ids[:, prompt_width:].tolist()


@pytest.mark.parametrize("name,device", MODES)
def test_left_padded_batch(name, device):
    """Three prompts of different lengths, left-padded: pads are neither stored nor read, so a row's tokens do not
    depend on which token pads it (the same shapes, bit for bit), equal the twin's, and on the CPU equal the ones
    it gets alone. (On a GPU a row run alone may round apart from the batch: cuBLAS picks its kernels by the batch,
    so there the run alone is reported, not asserted.)"""
    torch, gt, model, table, prompts = mode_model(name, device)
    with placed(model, device):
        def padded_run(pad, fmt="gaac"):  # `pad`: the token left of the shorter prompts
            ids, mask = left_padded(torch, prompts, pad=pad, device=device)
            cache = cache_for(gt, model, table, device, max_tokens=128, batch=3, cache_format=fmt)
            return ids, generate(model, ids, attention_mask=mask, cache=cache, max_new_tokens=8, do_sample=False,
                                 pad_token_id=0)
        ids, gaac_ids = padded_run(0)
        _, twin_ids = padded_run(0, "bf16")
        _, other_pad_ids = padded_run(1)
        assert new_tokens(gaac_ids, ids.shape[1]) == new_tokens(twin_ids, ids.shape[1])
        assert new_tokens(gaac_ids, ids.shape[1]) == new_tokens(other_pad_ids, ids.shape[1])
        for b, p in enumerate(prompts):
            cache = cache_for(gt, model, table, device, max_tokens=128)
            alone = generate(model, torch.tensor([p], device=device), cache=cache, max_new_tokens=8, do_sample=False,
                             pad_token_id=0)
            assert cache.lengths() == [len(p) + 7]  # the real tokens only
            agree = new_tokens(alone, len(p))[0] == new_tokens(gaac_ids, ids.shape[1])[b]
            print(f"[{name} on {device}] padded row {b} ({ids.shape[1] - len(p)} pads): "
                  f"{'the tokens it gets alone' if agree else 'differs from its run alone (batched matmuls round apart)'}")
            if device == "cpu":
                assert new_tokens(alone, len(p))[0][:2] == new_tokens(gaac_ids, ids.shape[1])[b][:2]


@pytest.mark.parametrize("name,device", MODES)
def test_sampling_with_scores(name, device):
    """Sampling with a seed, return_dict_in_generate with scores: equal sequences and equal scores."""
    torch, gt, model, table, prompts = mode_model(name, device)

    def run(cache):
        torch.manual_seed(3)
        return generate(model, torch.tensor([prompts[0]], device=device), cache=cache, max_new_tokens=8,
                        do_sample=True, top_k=20, return_dict_in_generate=True, output_scores=True, pad_token_id=0)

    with placed(model, device):
        gaac_out, twin_out = twins(gt, model, table, run, device=device)
        assert gaac_out.sequences.tolist() == twin_out.sequences.tolist()
        assert all(torch.equal(a, b) for a, b in zip(gaac_out.scores, twin_out.scores))
        # `cache` in the pinned transformers; `past_key_values` in releases before 5.24 (a GPU machine's own)
        returned = getattr(gaac_out, "cache", None) or gaac_out.past_key_values
        assert returned.get_seq_length() == gaac_out.sequences.shape[1] - 1


@pytest.mark.parametrize("name,device", MODES)
def test_beam_search(name, device):
    """num_beams=3 over a padded batch of two: reorder_cache forks the beams' shared prefixes."""
    torch, gt, model, table, prompts = mode_model(name, device)
    with placed(model, device):
        ids, mask = left_padded(torch, prompts[:2], device=device)
        gaac_ids, twin_ids = twins(gt, model, table, lambda cache: generate(
            model, ids, attention_mask=mask, cache=cache, max_new_tokens=6, num_beams=3, do_sample=False,
            pad_token_id=0), batch=6, device=device)
        assert gaac_ids.tolist() == twin_ids.tolist()


@pytest.mark.parametrize("name,device", MODES)
def test_assisted_decoding_crops(name, device):
    """Prompt-lookup decoding: candidate tokens forwarded together on a non-empty cache, the rejected ones cropped."""
    torch, gt, model, table, prompts = mode_model(name, device)
    with placed(model, device):
        prompt = torch.tensor([prompts[0] + prompts[0][1:]], device=device)  # repeated text: the lookup finds candidates
        gaac_ids, twin_ids = twins(gt, model, table, lambda cache: generate(
            model, prompt, cache=cache, max_new_tokens=10, do_sample=False, prompt_lookup_num_tokens=3,
            pad_token_id=0), device=device)
        assert gaac_ids.tolist() == twin_ids.tolist()


@pytest.mark.parametrize("name,device", MODES)
def test_prompt_cache_copied_and_conversation_continued(name, device):
    """A prompt's cache deep-copied and continued with two different suffixes (a second prompt on a non-empty cache);
    the original is left as it was; reset() empties it and it serves as new."""
    torch, gt, model, table, prompts = mode_model(name, device)
    import copy

    prefix = torch.tensor([prompts[0]], device=device)

    def run(cache):
        with torch.no_grad():
            forward(model, input_ids=prefix, cache=cache, use_cache=True)
        held = cache.get_seq_length()
        outs = []
        for suffix in (prompts[1][1:], prompts[2][1:]):
            mine = copy.deepcopy(cache)
            ids = torch.cat([prefix, torch.tensor([suffix], device=device)], dim=1)
            outs.append(new_tokens(generate(model, ids, cache=mine, max_new_tokens=6, do_sample=False,
                                            pad_token_id=0), ids.shape[1]))
        assert cache.get_seq_length() == held and cache.lengths() == [held]
        cache.reset()
        assert cache.get_seq_length() == 0 and cache.lengths() == [0] and cache.usage()["units_free"] == cache.usage()["units"]
        fresh = generate(model, prefix, cache=cache, max_new_tokens=4, do_sample=False, pad_token_id=0)
        return outs, fresh.tolist()

    with placed(model, device):
        gaac_out, twin_out = twins(gt, model, table, run, device=device)
        assert gaac_out == twin_out
        alone = generate(model, prefix, cache=cache_for(gt, model, table, device, max_tokens=128), max_new_tokens=4,
                         do_sample=False, pad_token_id=0)
        assert gaac_out[1] == alone.tolist()  # after reset, as a new cache


def test_random_llama_gpu_captured_decoding_of_a_padded_batch():
    """Decoding steps of a left-padded batch of unequal lengths captured once in a CUDA graph and replayed (every
    sequence one real token a step, each at its own position) give the tokens of the same steps run eagerly."""
    torch = need_module("torch")
    need_gpu(torch)
    torch, gt, model, table, prompts = real_model("random-llama")
    steps, eager_first = 12, 2
    with placed(model, "cuda"):
        ids, mask = left_padded(torch, prompts[:2], device="cuda")
        width = ids.shape[1]
        results = {}
        for mode in ("eager", "graph"):
            cache = cache_for(gt, model, table, "cuda", max_tokens=96, batch=2, plan_tokens=96)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.no_grad(), torch.cuda.stream(side):
                positions = (mask.cumsum(-1) - 1).clamp(min=0)
                out = forward(model, input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                              use_cache=True)
                step_ids = out.logits[:, -1].argmax(-1, keepdim=True)
                position = mask.sum(-1, keepdim=True)  # each sequence's next position: its real tokens so far
                columns = torch.cat([mask, torch.ones(2, steps, dtype=mask.dtype, device="cuda")], dim=1)
                logits = []

                def step(i):
                    return forward(model, input_ids=step_ids, attention_mask=columns[:, :width + i + 1],
                                   position_ids=position, cache=cache, use_cache=True).logits[:, -1]

                graph = captured = None
                for i in range(steps):
                    if mode == "eager" or i < eager_first:  # graph mode: the first steps warm up
                        last = step(i)
                    elif graph is None:
                        graph = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(graph, stream=side):
                            captured = step(i)
                        graph.replay()
                        last = captured
                    else:
                        graph.replay()
                        cache.note_replayed(1)  # the capture counted its own step
                        last = captured
                    logits.append(last.float().clone())
                    step_ids.copy_(last.argmax(-1, keepdim=True))
                    position += 1
            torch.cuda.synchronize()
            cache.kv.check()
            assert cache.lengths() == (mask.sum(-1) + steps).tolist()
            results[mode] = torch.stack(logits)
    eager, graph = results["eager"], results["graph"]
    assert torch.equal(eager.argmax(-1), graph.argmax(-1))
    assert torch.allclose(eager, graph, rtol=1e-2, atol=1e-2), float((eager - graph).abs().max())


def test_misuse_raises_a_gaac_error():
    """A GaacCache under another attention function, a batch larger than a non-empty cache's, a 4D mask and a
    mask that differs from the one the cache grew with: gaac.GaacError, naming the fix."""
    torch, gt, model, table, prompts = real_model(REAL_MODELS[0])
    import gaac

    ids = torch.tensor([prompts[1]])
    model.set_attn_implementation("sdpa")
    try:
        with pytest.raises(gaac.GaacError, match="set_attn_implementation"):
            generate(model, ids, cache=gt.GaacCache(model.config, table, max_tokens=64), max_new_tokens=2,
                           do_sample=False, pad_token_id=0)
    finally:
        model.set_attn_implementation(gt.ATTENTION)
    cache = gt.GaacCache(model.config, table, max_tokens=64)
    out = generate(model, ids, cache=cache, max_new_tokens=2, do_sample=False, pad_token_id=0)
    with pytest.raises(gaac.GaacError, match="reorder_cache"):
        forward(model, input_ids=torch.cat([out, out])[:, -1:], cache=cache, use_cache=True)
    with pytest.raises(gaac.GaacError, match="past columns"):
        mask = torch.ones(1, cache.get_seq_length() + 1, dtype=torch.long)
        mask[0, 0] = 0
        forward(model, input_ids=out[:, -1:], attention_mask=mask, cache=cache, use_cache=True)
    with pytest.raises(gaac.GaacError, match="4D"):
        full = torch.ones(1, 1, 1, cache.get_seq_length() + 1, dtype=torch.bool)
        forward(model, input_ids=out[:, -1:], attention_mask=full, cache=cache, use_cache=True)
    with pytest.raises(gaac.GaacError, match="negative"):
        cache.crop(3)


