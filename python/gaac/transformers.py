"""Hugging Face transformers integration: a KV cache that decodes from GAAC.

``GaacCache`` is a ``transformers.Cache`` whose layers live in one ``gaac.KvCache`` (compressed slots, or
BF16 for the twin: ``cache_format="bf16"``); the attention function registered as ``"gaac"`` reads it in
place with ``gaac.attend``. Use both together::

    import gaac.transformers as gt
    model = AutoModelForCausalLM.from_pretrained(..., dtype=torch.bfloat16, attn_implementation=gt.ATTENTION)
    table = gt.calibrate(model, calibration_ids)                 # exponent windows for this model
    cache = gt.GaacCache(model.config, table, max_tokens=4096)
    out = model.generate(input_ids, past_key_values=cache, max_new_tokens=64, do_sample=False)

The first prompt is attended with PyTorch's SDPA over its own keys and values (the cache is empty then);
every later forward (decoding steps, the next prompt of a conversation) with ``gaac.attend`` over the cache
plus the forward's own rows. A forward's K and V are added to the cache at the start of the next one, all
layers at once. Limits of this version: CPU tensors; batches without padding.
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


def _rows(states):
    """[batch, kv_heads, tokens, dim] bfloat16 -> per sequence a [tokens, kv_heads, dim] view (no copy)."""
    if states.dtype != torch.bfloat16 or states.device.type != "cpu":
        raise gaac.GaacError(f"GaacCache holds bfloat16 CPU tensors, got {states.dtype} on {states.device}")
    return [s.transpose(0, 1) for s in states]


class GaacLayer(CacheLayerMixin):
    """One model layer of a ``GaacCache``: the shared ``gaac.KvCache`` and this layer's pending rows."""

    is_sliding = False
    is_compileable = False

    def __init__(self, owner, index):
        super().__init__()
        self.owner, self.index = owner, index
        self.pending = None  # (k, v): this forward's rows, [batch, kv_heads, tokens, dim], not in the cache yet

    def lazy_initialization(self, key_states, value_states):
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.owner._commit_before(self.index)
        self.pending = (key_states, value_states)
        _current.set((self.owner, self.index))
        return key_states, value_states

    def get_seq_length(self):
        return self.owner.length() + (self.pending[0].shape[-2] if self.pending is not None else 0)

    def get_mask_sizes(self, query_length):
        return self.owner.length() + query_length, 0

    def get_max_length(self):
        return -1

    def reset(self):
        self.pending = None


class GaacCache(Cache):
    """A ``transformers`` KV cache held in a ``gaac.KvCache``.

    ``calibration``: a ``gaac.Calibration`` for the model (``calibrate``), required for ``cache_format="gaac"``;
    ``max_tokens``: tokens per sequence the budget must hold whatever the values (prompt and generated);
    ``batch``: sequences (the batch size of the inputs); ``cache_format``: ``"gaac"`` or ``"bf16"`` (the same
    structure and attention code, uncompressed: the twin to compare with); ``budget_bytes`` overrides the
    budget derived from ``max_tokens``.
    """

    def __init__(self, config, calibration=None, max_tokens=4096, batch=1, cache_format="gaac", budget_bytes=None,
                 attention_path="fused"):
        self.geometry = _geometry(config)
        layers, kv_heads, head_dim, windows = self.geometry
        table = calibration if cache_format == "gaac" else None
        if budget_bytes is None:
            budget_bytes = gaac.KvCache.worst_case_budget(layers, kv_heads, head_dim, max_tokens, batch, table,
                                                          cache_format, windows)
        self.kv = gaac.KvCache(layers, kv_heads, head_dim, budget_bytes, table, cache_format, windows)
        self.sequences = [self.kv.add_sequence() for _ in range(batch)]
        self.attention_path = attention_path
        super().__init__(layers=[GaacLayer(self, i) for i in range(layers)])

    def length(self):
        """Tokens of each sequence held in the gaac cache (the pending forward's not counted)."""
        return self.kv.length(self.sequences[0])

    def _commit_before(self, layer):
        """At layer 0 of a forward: appends the previous forward's rows of every layer to the gaac cache."""
        if layer != 0 or self.layers[0].pending is None:
            return
        pending = [l.pending for l in self.layers]
        if any(p is None for p in pending):
            raise gaac.GaacError("GaacCache: a forward did not reach every layer")
        for b, s in enumerate(self.sequences):
            self.kv.append(s, [_rows(k)[b] for k, _ in pending], [_rows(v)[b] for _, v in pending])
        for l in self.layers:
            l.pending = None

    def usage(self):
        """The gaac cache's accounting (resident bytes, BF16 bytes of the same values, tiles by class)."""
        return self.kv.usage()


def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """The ``"gaac"`` attention function: SDPA over a prompt that starts the cache; otherwise ``gaac.attend`` over
    the cache plus the forward's own rows, one query per (sequence, new token), each attending up to its own
    position (a decoding step, or a later prompt such as the next turn of a chat)."""
    current = _current.get()
    if current is None or (query.shape[2] > 1 and current[0].length() == 0):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    owner, layer = current
    if kwargs.get("softcap") is not None:
        raise gaac.GaacError("GaacCache: attention logit soft-capping is not supported")
    batch, q_heads, tokens, head_dim = query.shape
    q = query.transpose(1, 2).float().contiguous().view(batch * tokens, q_heads, head_dim).numpy()
    rows_k, rows_v = _rows(key), _rows(value)
    start = owner.length()
    sequences = [s for s in owner.sequences for _ in range(tokens)]
    positions = [start + i for _ in owner.sequences for i in range(tokens)]
    extra_k = [rows_k[b] for b in range(batch) for _ in range(tokens)]
    extra_v = [rows_v[b] for b in range(batch) for _ in range(tokens)]
    out = gaac.attend(owner.kv, layer, sequences, q, positions=positions, scale=scaling, path=owner.attention_path,
                      extra_k=extra_k, extra_v=extra_v)
    out = torch.from_numpy(out).to(query.dtype).view(batch, tokens, q_heads, head_dim)
    return out, None


AttentionInterface.register(ATTENTION, attention)
AttentionMaskInterface.register(ATTENTION, sdpa_mask)


@torch.no_grad()
def calibrate(model, input_ids):
    """Exponent windows for ``model``'s cache, learnt on the K and V it computes for ``input_ids`` (a
    [1, tokens] tensor of a representative text; a few hundred to a few thousand tokens)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    model(input_ids=input_ids, past_key_values=cache, use_cache=True)
    # gaac.calibrate reads bfloat16 tensors of any strides: [tokens, kv_heads, dim] views of the layers.
    return gaac.calibrate([l.keys[0].transpose(0, 1) for l in cache.layers],
                          [l.values[0].transpose(0, 1) for l in cache.layers])
