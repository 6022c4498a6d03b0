"""Hugging Face transformers integration: a KV cache that decodes from GAAC.

``GaacCache`` is a ``transformers.Cache`` whose layers live in one ``gaac.BatchKvCache`` (compressed slots,
or BF16 for the twin: ``cache_format="bf16"``), on the CPU or on a GPU; the attention function registered as
``"gaac"`` (with its mask function) reads it in place. Use both together::

    import gaac.transformers as gt
    model = AutoModelForCausalLM.from_pretrained(..., dtype=torch.bfloat16, attn_implementation=gt.ATTENTION)
    table = gt.calibrate(model, calibration_ids)                 # exponent windows for this model
    cache = gt.GaacCache(model.config, table, max_tokens=4096)   # device="cuda" where the model runs on a GPU
    out = model.generate(input_ids, cache=cache, max_new_tokens=64, do_sample=False)
    # (transformers before the rename, e.g. 5.17: past_key_values=cache; cache_argument(model) says which)

At the first layer of each forward the cache takes the forward's real tokens from the attention mask: pad
tokens (a left-padded batch) are never stored nor read, and each sequence holds its own tokens only. Every
layer writes its K and V rows there and attends through it: a prompt that starts an empty cache with
PyTorch's SDPA over its own rows, every later forward (decoding steps, assisted decoding's candidates, the next
prompt of a conversation) with the cache's own attention (on the CPU ``gaac.attend``, each real token at its
own position; on a GPU the fused kernel reading the compressed cache). Between forwards ``generate`` edits the
batch through the cache's methods: ``reorder_cache`` (beam search: a beam chosen twice is a fork, its complete
blocks shared), ``batch_select_indices``, ``batch_repeat_interleave``, ``crop`` (rejected candidates, each
block cut inside decoded back into a BF16 tail, bit for bit), ``reset``; ``copy.deepcopy`` copies the whole
cache (``gaac.BatchKvCache.clone``), to reuse a prompt's cache. Sampling and ``return_dict_in_generate`` need
nothing of the cache. The GPU cache does all of it on the device: each sequence grows, finishes and is freed by
its own real tokens, a forward of several tokens attends each of them at its own position, forks share their
complete blocks (reference-counted units). On a GPU nothing in a decoding step syncs with the host or allocates
once warm, so the step can be captured in a CUDA graph (``plan_tokens`` keeps the captured plan right while the
sequences grow); a captured step takes its new tokens as real, as generate's decoding steps are (pads
before them, a left-padded prompt's, are fine).

Never a silent wrong result: a ``GaacCache`` whose layers are attended by another attention function (a model
left at ``"sdpa"`` or ``"eager"``), a 4D mask, a mask pattern other than causal attention within the model's
sliding windows (counted in each sequence's own tokens), or an attention mask whose past columns differ from
those the cache grew with raise ``gaac.GaacError`` saying what to do instead.

Limits of this version: a prompt's blocks stay BF16 until the end of its forward, so the budget must hold the
prompt uncompressed (the default budget, the worst case for ``max_tokens``, always does); on a GPU a forward of
several tokens on a non-empty cache also keeps, until the next forward, the sliding-window blocks its first token
attends. ``crop`` back past positions a sliding window has already released raises.
"""
import contextvars
import functools
import inspect
import weakref

import torch
from transformers import AttentionInterface, Cache
from transformers.cache_utils import CacheLayerMixin
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, prepare_padding_mask, sdpa_mask

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


def _capturing(tensor):
    """True while ``tensor``'s stream captures a CUDA graph (nothing may read the device then)."""
    return tensor.is_cuda and torch.cuda.is_current_stream_capturing()


class GaacMask:
    """What the ``"gaac"`` mask function makes of transformers' mask arguments for the attention function: the
    forward's 2D padding mask (``padding``: ``[batch, kv_length]`` bool, or None: no pads) and, built on demand,
    the mask SDPA would get (``sdpa``) and the whole boolean mask (``full``, ``[batch, 1, q_length, kv_length]``)
    that a ``GaacCache`` checks its own attention pattern against."""

    def __init__(self, arguments):
        self.arguments = arguments
        self.checked = set()  # the windows whose pattern was checked against this mask
        mask, kv_length = arguments["attention_mask"], arguments["kv_length"]
        self.padding = None if mask is None else prepare_padding_mask(mask, kv_length, arguments["kv_offset"])

    @functools.cached_property
    def sdpa(self):
        return sdpa_mask(**self.arguments)

    @functools.cached_property
    def full(self):
        return sdpa_mask(**{**self.arguments, "allow_is_causal_skip": False, "allow_is_bidirectional_skip": False})


def mask(**arguments):
    """The ``"gaac"`` mask function: transformers' arguments kept for the attention function (``GaacMask``)."""
    return GaacMask(arguments)


class GaacLayer(CacheLayerMixin):
    """One model layer of a ``GaacCache``: its index in the shared ``gaac.BatchKvCache``. The work is the
    cache's: the attention function registered as ``"gaac"`` writes and attends the layer's rows."""

    is_sliding = False
    is_compileable = False
    is_croppable = True

    def __init__(self, owner, index):
        super().__init__()
        # A weak reference: the cache holds its layers, and a cycle would keep its device memory alive after
        # the last `del` until the garbage collector runs.
        self._owner, self.index = weakref.ref(owner), index

    @property
    def owner(self):
        """The GaacCache this layer belongs to."""
        return self._owner()

    def lazy_initialization(self, key_states, value_states):
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.owner._updated(self.index)
        return key_states, value_states

    def get_seq_length(self):
        return self.owner.get_seq_length()

    def get_mask_sizes(self, query_length):
        return self.owner.get_seq_length() + query_length, 0

    def get_max_length(self):
        return -1

    def reset(self):
        self.owner.reset()


class GaacCache(Cache):
    """A ``transformers`` KV cache held in a ``gaac.BatchKvCache``, for every way ``model.generate`` decodes:
    greedy and sampling, batches with padding, beam search, assisted decoding, prompts appended to a conversation.

    ``calibration``: a ``gaac.Calibration`` for the model (``calibrate``), required for ``cache_format="gaac"``;
    ``max_tokens``: tokens per sequence the budget must hold whatever the values (prompt and generated);
    ``batch``: sequences the budget is made for (the rows the model sees: the batch times ``num_beams``; an empty
    cache takes the batch of its first input); ``cache_format``: ``"gaac"`` or ``"bf16"`` (the same structure
    and attention code, uncompressed: the twin to compare with); ``budget_bytes`` overrides the budget derived
    from ``max_tokens``; ``device``: ``"cpu"`` or ``"cuda"`` (where the model runs); ``attention_path``: the CPU
    kernel (``"fused"`` or ``"reference"``). On a GPU, ``blocks_per_split`` fixes how the context is split (0:
    planned for the GPU; give a ``"gaac"`` and a ``"bf16"`` cache the same value and they attend with the same
    bits) and ``plan_tokens`` plans every launch for sequences that long (for a step captured in a CUDA graph and
    replayed while the sequences grow).

    Positions are transformers' columns: ``get_seq_length()`` counts the columns forwarded, pads included, while
    each sequence holds only its real tokens (``lengths()``). A mask the cache cannot honour (a 4D mask, a pattern
    other than causal attention within the model's sliding windows, past columns marked otherwise than when they
    were forwarded) and a model whose attention is not ``ATTENTION`` raise ``gaac.GaacError``.
    """

    def __init__(self, config, calibration=None, max_tokens=4096, batch=1, cache_format="gaac", budget_bytes=None,
                 attention_path="fused", device="cpu", blocks_per_split=0, plan_tokens=0):
        self.geometry = _geometry(config)
        layers, kv_heads, head_dim, windows = self.geometry
        table = calibration if cache_format == "gaac" else None
        if budget_bytes is None:
            budget_bytes = gaac.KvCache.worst_case_budget(layers, kv_heads, head_dim, max_tokens, batch, table,
                                                          cache_format, windows)
        self._adopt(gaac.BatchKvCache(layers, kv_heads, head_dim, budget_bytes, table, cache_format, windows,
                                      batch=batch, max_tokens=max_tokens, device=torch.device(device).type,
                                      attention_path=attention_path, blocks_per_split=blocks_per_split,
                                      plan_tokens=plan_tokens),
                    torch.zeros(batch, 0, dtype=torch.bool))

    def _adopt(self, kv, stored):
        """Takes ``kv`` and the columns it stored (``stored``: ``[batch, columns]`` bool, on the CPU)."""
        self.kv, self._stored = kv, stored
        self._unattended = None  # the layer updated and not yet attended
        self._prefill = False    # the running forward started an empty cache
        super().__init__(layers=[GaacLayer(self, i) for i in range(self.geometry[0])])

    # -- what transformers asks of a cache -------------------------------------------------------------------

    def get_seq_length(self, layer_idx=0):
        """Columns forwarded so far (each sequence's real tokens and pads)."""
        return self._stored.shape[1]

    def get_mask_sizes(self, query_length, layer_idx=0):
        return self.get_seq_length() + query_length, 0

    def get_max_length(self, layer_idx=None):
        return -1

    @property
    def batch_size(self):
        return self.kv.batch

    @property
    def is_compileable(self):
        return False

    def reset(self):
        """Empties every sequence; the whole budget is free again."""
        self.kv.reset()
        self._stored = torch.zeros(self.kv.batch, 0, dtype=torch.bool)

    def reorder_cache(self, beam_idx):
        """Beam search: row i becomes what row ``beam_idx[i]`` held (a row chosen twice is forked, its complete
        blocks shared)."""
        self._select([int(i) for i in beam_idx.tolist()])

    def batch_select_indices(self, indices):
        """Keeps the rows ``indices`` (a tensor or a list), in that order."""
        self._select([int(i) for i in (indices.tolist() if torch.is_tensor(indices) else indices)])

    def batch_repeat_interleave(self, repeats):
        """Each row ``repeats`` times in a row (forks)."""
        self._select([b for b in range(self.kv.batch) for _ in range(repeats)])

    def crop(self, tokens_to_remove):
        """Removes the last ``-tokens_to_remove`` columns (a count of 0 or less, as transformers' caches take it):
        each sequence is cut back to the real tokens it forwarded before them."""
        if tokens_to_remove > 0:
            raise gaac.GaacError(f"crop takes the columns to remove as a negative count (transformers' convention), "
                                 f"got {tokens_to_remove}")
        keep = max(0, self.get_seq_length() + tokens_to_remove)
        if keep == self.get_seq_length():
            return
        self.kv.truncate(self._stored[:, :keep].sum(dim=1).tolist())
        self._stored = self._stored[:, :keep]

    def __deepcopy__(self, memo):
        """An independent copy (transformers' way to reuse a prompt's cache): ``gaac.BatchKvCache.clone``."""
        other = object.__new__(type(self))
        other.geometry = self.geometry
        other._adopt(self.kv.clone(), self._stored.clone())
        for mine, theirs in zip(self.layers, other.layers):
            if mine.is_initialized:
                theirs.dtype, theirs.device, theirs.is_initialized = mine.dtype, mine.device, True
        return other

    # -- gaac's own ------------------------------------------------------------------------------------------

    def lengths(self):
        """Real tokens each sequence holds (the running forward's included)."""
        return self.kv.lengths

    def usage(self):
        """The gaac cache's accounting (resident bytes, BF16 bytes of the same values, tiles by class)."""
        return self.kv.usage()

    def note_replayed(self, count=1):
        """GPU: counts on the host one replay of a captured decoding step of ``count`` tokens per sequence (see
        ``gaac.BatchKvCache``)."""
        self.kv.note_replayed(count)
        self.note_written(count)

    def note_written(self, count):
        """Counts ``count`` columns of real tokens that were begun and written through ``self.kv`` directly (as a
        benchmark fills a cache), so that positions and masks follow."""
        self._stored = torch.cat([self._stored, torch.ones(self.kv.batch, count, dtype=torch.bool)], dim=1)

    def _select(self, rows):
        self.kv.select(rows)
        if self._stored.shape[1] == 0:  # an empty cache: no columns to carry
            self._stored = torch.zeros(len(rows), 0, dtype=torch.bool)
        else:
            self._stored = self._stored[rows]

    def _updated(self, layer):
        """A layer's update: the attention function registered as ``ATTENTION`` must read it next."""
        if self._unattended is not None:
            missed, self._unattended = self._unattended, None
            raise gaac.GaacError(
                f"GaacCache: layer {missed} was updated and not attended by gaac's attention function, so the cache "
                f"was never read; load the model with attn_implementation=gaac.transformers.ATTENTION (or call "
                f"model.set_attn_implementation(gaac.transformers.ATTENTION)) to use a GaacCache")
        self._unattended = layer
        _current.set((self, layer))

    def _begin(self, mask, batch, tokens, device):
        """The first layer of a forward: its real tokens per sequence, from the padding mask."""
        columns = self.get_seq_length()
        if batch != self.kv.batch:
            if columns == 0 and not any(self.kv.lengths):
                self._select([0] * batch)  # an empty cache takes the input's batch
            else:
                raise gaac.GaacError(
                    f"GaacCache: the input has {batch} rows but the cache holds {self.kv.batch} sequences; reorder, "
                    f"select or repeat its rows first (reorder_cache, batch_select_indices, batch_repeat_interleave) "
                    f"or reset() it")
        if mask.arguments["kv_length"] != columns + tokens or mask.arguments["kv_offset"] != 0:
            raise gaac.GaacError(f"GaacCache: the mask covers {mask.arguments['kv_length']} columns, the cache "
                                 f"{columns} and the forward {tokens}")
        valid = None
        if mask.padding is not None and not _capturing(mask.padding):
            padding = mask.padding.cpu()
            if tuple(padding.shape) != (batch, columns + tokens):
                raise gaac.GaacError(f"GaacCache: an attention mask of shape {tuple(padding.shape)} for "
                                     f"{batch} rows of {columns + tokens} columns")
            if not torch.equal(padding[:, :columns], self._stored):
                raise gaac.GaacError(
                    "GaacCache: the attention mask marks past columns otherwise than when they were forwarded (the "
                    "cache holds only the tokens then marked real); pass the mask that grew with the cache")
            valid = padding[:, columns:]
        elif mask.padding is None and not bool(self._stored.all()):
            raise gaac.GaacError("GaacCache: no attention mask, but the cache skipped pad tokens before; pass the "
                                 "attention mask that grew with the cache")
        # While a CUDA graph is captured the mask cannot be read: the forward's tokens count as real (a decoding
        # step of generate, whose new tokens are always real).
        self._prefill = columns == 0 and not any(self.kv.lengths)
        flags = None if valid is None or bool(valid.all()) else valid.flatten().to(torch.uint8).tolist()
        self.kv.begin(tokens, flags, _stream_of_device(device), attended=not self._prefill)
        real = torch.ones(batch, tokens, dtype=torch.bool) if valid is None else valid
        self._stored = torch.cat([self._stored, real], dim=1)

    def _check_pattern(self, mask, layer, query):
        """Raises unless ``mask`` asks exactly what the cache's attention does: each real query attends the real
        tokens of its sequence up to itself, within the layer's sliding window (counted in the sequence's
        tokens). Once per mask and window; not while a CUDA graph is captured."""
        window = self.geometry[3][layer]
        if window in mask.checked or _capturing(query):
            return
        stored = self._stored.to(query.device)
        batch, kv_length = stored.shape
        tokens = query.shape[2]
        q_columns = torch.arange(kv_length - tokens, kv_length, device=query.device)
        positions = torch.arange(kv_length, device=query.device)
        ours = stored[:, None, :] & (positions[None, None, :] <= q_columns[None, :, None])
        if window:
            rank = stored.cumsum(dim=1)
            ours &= (rank[:, q_columns][:, :, None] - rank[:, None, :]) < window
        theirs = mask.full
        theirs = theirs.expand(batch, 1, tokens, kv_length)[:, 0] if theirs is not None else ours
        if bool(((ours != theirs) & stored[:, q_columns][:, :, None]).any()):
            raise gaac.GaacError(
                "GaacCache cannot honour this attention mask: it attends each real token to the real tokens of its "
                "sequence up to itself, within the model's sliding windows counted in those tokens, and the mask asks "
                "for another pattern (custom or bidirectional masks; pads inside a sliding window); use a "
                "DynamicCache for it")
        mask.checked.add(window)

    def _attend(self, module, layer, query, key, value, attention_mask, dropout, scaling, kwargs):
        self._unattended = None
        if not isinstance(attention_mask, GaacMask):
            raise gaac.GaacError(
                "GaacCache: the attention function was given a mask the 'gaac' mask function did not make (a 4D "
                "mask?); pass the 2D padding mask ([batch, columns]) and let the model build the rest")
        if kwargs.get("softcap") is not None:
            raise gaac.GaacError("GaacCache: attention logit soft-capping is not supported")
        batch, q_heads, tokens, head_dim = query.shape
        if layer == 0:
            self._begin(attention_mask, batch, tokens, query.device)
        self._check_pattern(attention_mask, layer, query)
        stream = _stream(query)
        self.kv.write(layer, key, value, stream)
        if self._prefill:  # a prompt that starts the cache: SDPA over its own rows, pads masked
            return sdpa_attention_forward(module, query, key, value, attention_mask.sdpa, dropout=dropout,
                                          scaling=scaling, **kwargs)
        out = torch.empty(batch, tokens, q_heads, head_dim, dtype=query.dtype, device=query.device)
        self.kv.attend(layer, query.contiguous(), out.transpose(1, 2), scale=scaling, stream=stream)
        return out, None


def _stream_of_device(device):
    device = torch.device(device)
    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0


def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """The ``"gaac"`` attention function. Over a ``GaacCache``: the layer's rows written to the cache, then a prompt
    that starts the cache attends with SDPA over its own rows, every later forward (decoding steps, candidate
    tokens, the next prompt of a conversation) with the cache's own attention, each real token at its own
    position. Without one (no cache, or another cache): SDPA, as transformers' ``"sdpa"``."""
    current = _current.get()
    _current.set(None)  # this layer's alone: a later forward over another cache must not see it
    if current is None:
        mask = attention_mask.sdpa if isinstance(attention_mask, GaacMask) else attention_mask
        return sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scaling, **kwargs)
    owner, layer = current
    return owner._attend(module, layer, query, key, value, attention_mask, dropout, scaling, kwargs)


AttentionInterface.register(ATTENTION, attention)
AttentionMaskInterface.register(ATTENTION, mask)


def cache_argument(model):
    """The keyword under which ``model`` (its ``forward`` and ``generate``) takes a cache in the installed
    transformers: ``"cache"`` from the versions that renamed it, ``"past_key_values"`` before. A cache passed
    under the other name is not used (or refused), so code meant for several versions asks here."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


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
    model(input_ids=input_ids, use_cache=True, logits_to_keep=1, **{cache_argument(model): cache})
    return calibrate_kv([l.keys for l in cache.layers], [l.values for l in cache.layers], sample_tokens)
