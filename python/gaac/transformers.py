"""Hugging Face transformers integration: a KV cache that decodes from GAAC.

``GaacCache`` is a ``transformers.Cache`` whose layers live in one ``gaac.BatchKvCache`` (compressed slots,
or BF16 for the twin: ``cache_format="bf16"``), on the CPU or on a GPU; the attention function registered as
``"gaac"`` reads it in place. Use both together::

    import gaac.transformers as gt
    model = AutoModelForCausalLM.from_pretrained(..., dtype=torch.bfloat16, attn_implementation=gt.ATTENTION)
    table = gt.calibrate(model, calibration_ids)                 # exponent windows for this model
    cache = gt.GaacCache(model.config, table, max_tokens=4096)   # device="cuda" where the model runs on a GPU
    out = model.generate(input_ids, past_key_values=cache, max_new_tokens=64, do_sample=False)

Each forward begins on the cache at its first layer; every layer writes its K and V rows there and attends
through it: a prompt that starts an empty cache with PyTorch's SDPA over its own rows, every later forward
(decoding steps; on the CPU also the next prompt of a conversation) with the cache's own attention (on the
CPU ``gaac.attend``, each new token at its own position; on a GPU the fused kernel reading the compressed
cache). On a GPU nothing in a decoding step syncs with the host or allocates once warm, so the step can be
captured in a CUDA graph (``plan_tokens`` keeps the captured plan right while the sequences grow).

Limits of this version: batches without padding; on a GPU, a prompt on a non-empty cache (a second turn)
is not supported yet, and a prompt's blocks stay BF16 until the end of its forward, so the budget must hold
the prompt uncompressed (the default budget, the worst case for ``max_tokens``, always does).
"""
import contextvars

import torch
from transformers import AttentionInterface, Cache
from transformers.cache_utils import CacheLayerMixin
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

import gaac

ATTENTION = "gaac"
"""The ``attn_implementation`` name of the attention function that reads a ``GaacCache``."""

# The cache and layer of the attention call that follows an update (transformers calls a layer's attention
# right after its cache update and does not hand the cache to the attention function).
_current = contextvars.ContextVar("gaac_current_layer", default=None)


def _geometry(config):
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = text.num_hidden_layers
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    types = getattr(text, "layer_types", None) or ["full_attention"] * layers
    window = getattr(text, "sliding_window", None) or 0
    windows = [window if t == "sliding_attention" else 0 for t in types]
    return layers, kv_heads, head_dim, windows


def _stream(tensor):
    """The stream work on ``tensor`` is queued on: PyTorch's current CUDA stream, or 0 on the CPU."""
    return torch.cuda.current_stream(tensor.device).cuda_stream if tensor.is_cuda else 0


class GaacLayer(CacheLayerMixin):
    """One model layer of a ``GaacCache``: its index in the shared ``gaac.BatchKvCache``."""

    is_sliding = False
    is_compileable = False

    def __init__(self, owner, index):
        super().__init__()
        self.owner, self.index = owner, index

    def lazy_initialization(self, key_states, value_states):
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        kv, stream = self.owner.kv, _stream(key_states)
        if self.index == 0:
            kv.begin(key_states.shape[-2], stream)
        kv.write(self.index, key_states, value_states, stream)
        _current.set((self.owner, self.index))
        return key_states, value_states

    def get_seq_length(self):
        return self.owner.kv.length

    def get_mask_sizes(self, query_length):
        return self.owner.kv.length + query_length, 0

    def get_max_length(self):
        return -1

    def reset(self):
        pass


class GaacCache(Cache):
    """A ``transformers`` KV cache held in a ``gaac.BatchKvCache``.

    ``calibration``: a ``gaac.Calibration`` for the model (``calibrate``), required for ``cache_format="gaac"``;
    ``max_tokens``: tokens per sequence the budget must hold whatever the values (prompt and generated);
    ``batch``: sequences (the batch size of the inputs); ``cache_format``: ``"gaac"`` or ``"bf16"`` (the same
    structure and attention code, uncompressed: the twin to compare with); ``budget_bytes`` overrides the
    budget derived from ``max_tokens``; ``device``: ``"cpu"`` or ``"cuda"`` (where the model runs);
    ``attention_path``: the CPU kernel (``"fused"`` or ``"reference"``). On a GPU, ``blocks_per_split`` fixes
    how the context is split (0: planned for the GPU; give a ``"gaac"`` and a ``"bf16"`` cache the same value
    and they attend with the same bits) and ``plan_tokens`` plans every launch for sequences that long (for a
    step captured in a CUDA graph and replayed while the sequences grow).
    """

    def __init__(self, config, calibration=None, max_tokens=4096, batch=1, cache_format="gaac", budget_bytes=None,
                 attention_path="fused", device="cpu", blocks_per_split=0, plan_tokens=0):
        self.geometry = _geometry(config)
        layers, kv_heads, head_dim, windows = self.geometry
        table = calibration if cache_format == "gaac" else None
        if budget_bytes is None:
            budget_bytes = gaac.KvCache.worst_case_budget(layers, kv_heads, head_dim, max_tokens, batch, table,
                                                          cache_format, windows)
        self.kv = gaac.BatchKvCache(layers, kv_heads, head_dim, budget_bytes, table, cache_format, windows,
                                    batch=batch, max_tokens=max_tokens, device=torch.device(device).type,
                                    attention_path=attention_path, blocks_per_split=blocks_per_split,
                                    plan_tokens=plan_tokens)
        super().__init__(layers=[GaacLayer(self, i) for i in range(layers)])

    def length(self):
        """Tokens each sequence holds (the running forward's included)."""
        return self.kv.length

    def usage(self):
        """The gaac cache's accounting (resident bytes, BF16 bytes of the same values, tiles by class)."""
        return self.kv.usage()

    def note_replayed(self, count=1):
        """GPU: counts on the host one replay of a captured decoding step (see ``gaac.BatchKvCache``)."""
        self.kv.note_replayed(count)


def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """The ``"gaac"`` attention function: SDPA over a prompt that starts the cache (its own rows); otherwise the
    cache's attention over what it holds, one query per (sequence, new token), each attending up to its own
    position (a decoding step, or on the CPU a later prompt such as the next turn of a chat)."""
    current = _current.get()
    _current.set(None)  # this layer's alone: a later forward over another cache must not see it
    tokens = query.shape[2]
    if current is None or (tokens > 1 and current[0].kv.length == tokens):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    owner, layer = current
    if kwargs.get("softcap") is not None:
        raise gaac.GaacError("GaacCache: attention logit soft-capping is not supported")
    batch, q_heads, _, head_dim = query.shape
    out = torch.empty(batch, tokens, q_heads, head_dim, dtype=query.dtype, device=query.device)
    owner.kv.attend(layer, query.contiguous(), out.transpose(1, 2), scale=scaling,
                    stream=_stream(query))
    return out, None


AttentionInterface.register(ATTENTION, attention)
AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def spread_positions(tokens, sample_tokens):
    """Positions of about ``sample_tokens`` tokens in whole 16-token blocks spread evenly over ``tokens``."""
    if sample_tokens is not None and sample_tokens < 16:
        raise gaac.GaacError(f"sample_tokens must be at least 16 (one block), got {sample_tokens}")
    blocks = tokens // 16
    if sample_tokens is None or sample_tokens >= tokens or blocks == 0:
        return torch.arange(tokens)
    every = max(1, blocks // max(1, sample_tokens // 16))
    return (torch.arange(0, blocks, every)[:, None] * 16 + torch.arange(16)).flatten()


def calibrate_kv(keys, values, sample_tokens=None):
    """Exponent windows learnt on K and V as transformers holds them: per layer a ``[1, kv_heads, tokens,
    head_dim]`` bfloat16 tensor, on any device. ``sample_tokens`` learns on that many positions spread over
    them (see ``spread_positions``) instead of all of them."""
    rows = None
    if sample_tokens is not None:
        rows = spread_positions(keys[0].shape[2], sample_tokens).to(keys[0].device)

    def rows_of(states):  # [tokens, kv_heads, dim] on the CPU (gaac.calibrate reads any strides)
        states = states[0].transpose(0, 1)
        return (states if rows is None else states[rows]).cpu()

    return gaac.calibrate([rows_of(k) for k in keys], [rows_of(v) for v in values])


@torch.no_grad()
def calibrate(model, input_ids, sample_tokens=None):
    """Exponent windows for ``model``'s cache, learnt on the K and V it computes for ``input_ids`` (a [1, tokens]
    tensor of a representative text). Exponents drift with position (rotary embeddings turn the keys), so the
    text should be as long as the contexts to be served: windows learnt on the first 1024 positions left 28% of
    SmolLM2's tiles raw at 8K, learnt on 1024 positions spread over the 8K 0.3% (docs/performance.md).
    ``sample_tokens`` learns on that many positions spread over the text instead of all of them."""
    from transformers import DynamicCache

    cache = DynamicCache()  # every layer whole, sliding ones too: their windows move over every position
    model(input_ids=input_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return calibrate_kv([l.keys for l in cache.layers], [l.values for l in cache.layers], sample_tokens)
