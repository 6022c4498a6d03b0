"""FlashInfer's paged BF16 decode inside a transformers model, as a peer configuration of bench_e2e.py.

``FlashInferCache`` holds every layer's K and V in FlashInfer's paged layout (NHD, pages of 16 tokens: one
``[pages, 2, 16, kv_heads, head_dim]`` BF16 tensor per layer, each sequence's pages consecutive) and decodes with
``flashinfer.BatchDecodeWithPagedKVCacheWrapper`` (tensor cores, planned once, CUDA-graph buffers), the way a
server built on FlashInfer does. The attention function registered as ``ATTENTION`` writes each step's new K and
V into their page and attends the sequence's pages.

What it is for: the decode step of the serving experiment, at a fixed position. It is filled from a prefill's K
and V directly (no prefill through it), every sequence holds the same ``context`` tokens, and each step writes
its token at position ``context`` and attends positions 0..context (a sliding layer only the pages its window
reaches, masked by FlashInfer's ``window_left``), so a replayed step rewrites the same slot rather than growing.
Memory: a full layer reserves the pages of ``context + growth`` tokens per sequence, a sliding layer those of its
window plus ``growth`` (the room a growing sequence needs), all of it counted. Anything else raises: a forward
of more than one token, another softmax scale than the planned one, logit soft-capping.
"""
import contextvars
import math

import torch
from transformers import AttentionInterface, Cache
from transformers.cache_utils import CacheLayerMixin
from transformers.masking_utils import AttentionMaskInterface

ATTENTION = "fi_paged_decode"  # (a name with "flash" in it would be taken for a flash-attention kernel)
PAGE = 16
WORKSPACE_BYTES = 256 << 20

# The cache and layer of the attention call that follows an update (transformers hands the attention function
# no cache).
_current = contextvars.ContextVar("flashinfer_current_layer", default=None)


def _pages_per_sequence(context, window, growth):
    """Pages a sequence reserves in a layer: its tokens and `growth` more, or for a sliding layer of `window`
    tokens what that window reaches plus `growth`."""
    full = math.ceil((context + growth) / PAGE)
    return full if window == 0 else min(full, math.ceil((window + growth) / PAGE) + 1)


def _step_pages(context, window):
    """(first page, pages) a step at position `context` attends in a layer of `window` (0: full attention)."""
    first = 0 if window == 0 else max(0, context - window + 1) // PAGE
    return first, context // PAGE - first + 1


class FlashInferLayer(CacheLayerMixin):
    """One layer of a ``FlashInferCache``; the attention function does the writing and reading."""

    is_compileable = False

    def __init__(self, owner, index, sliding):
        super().__init__()
        self.owner, self.index, self.is_sliding = owner, index, sliding

    def lazy_initialization(self, key_states, value_states):
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        _current.set((self.owner, self.index))
        return key_states, value_states

    def get_seq_length(self):
        return self.owner.context

    def get_mask_sizes(self, query_length):
        return self.owner.context + query_length, 0

    def get_max_length(self):
        return -1


class FlashInferCache(Cache):
    """``batch`` sequences of ``context`` tokens of ``kv`` (a prefill's ``[(k, v)]`` per layer, each
    ``[1, kv_heads, tokens, head_dim]`` with at least ``context + 1`` tokens) in FlashInfer's paged layout.
    ``geometry``: (layers, kv_heads, head_dim, windows) as ``gaac.transformers._geometry`` gives it; ``scale``:
    the softmax scale of every layer."""

    def __init__(self, flashinfer, geometry, q_heads, kv, batch, context, scale, growth):
        layers, kv_heads, head_dim, windows = geometry
        self.context, self.scale, self.batch = context, scale, batch
        device = kv[0][0].device
        self.windows = windows
        self.pages, pages_per_sequence = [], {}  # the latter per window
        for layer, (k, v) in enumerate(kv):
            window = windows[layer]
            per_sequence = _pages_per_sequence(context, window, growth)
            first, _ = _step_pages(context, window)
            start = first * PAGE
            tokens = per_sequence * PAGE
            rows = lambda x: x[0, :, start:start + tokens].transpose(0, 1)  # [tokens, kv_heads, head_dim]
            kk, vv = rows(k), rows(v)
            if kk.shape[0] < tokens:  # pages past the prompt (room to grow) hold zeros
                pad = torch.zeros(tokens - kk.shape[0], kv_heads, head_dim, dtype=kk.dtype, device=kk.device)
                kk, vv = torch.cat([kk, pad]), torch.cat([vv, pad])
            one = torch.stack((kk.reshape(per_sequence, PAGE, kv_heads, head_dim),
                               vv.reshape(per_sequence, PAGE, kv_heads, head_dim)), dim=1)
            self.pages.append(one.repeat(batch, 1, 1, 1, 1))  # [batch * per_sequence, 2, PAGE, kv_heads, d]
            del one, kk, vv
            pages_per_sequence.setdefault(window, per_sequence)
        # One plan (wrapper) per window: full layers, and each sliding window.
        self.wrappers, self.write_page = {}, {}
        offset = context % PAGE
        for window, per_sequence in pages_per_sequence.items():
            _, count = _step_pages(context, window)
            indptr = torch.arange(batch + 1, dtype=torch.int32) * count
            indices = (torch.arange(batch, dtype=torch.int32)[:, None] * per_sequence +
                       torch.arange(count, dtype=torch.int32)[None, :]).flatten()
            last = torch.full((batch,), offset + 1, dtype=torch.int32)
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device), "NHD", use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=torch.empty(batch + 1, dtype=torch.int32, device=device),
                paged_kv_indices_buffer=torch.empty(batch * count, dtype=torch.int32, device=device),
                paged_kv_last_page_len_buffer=torch.empty(batch, dtype=torch.int32, device=device))
            wrapper.plan(indptr, indices, last, q_heads, kv_heads, head_dim, PAGE,
                         window_left=window - 1 if window else -1, q_data_type=torch.bfloat16,
                         kv_data_type=torch.bfloat16, sm_scale=scale)
            self.wrappers[window] = wrapper
            # The page of each sequence that position `context` falls in.
            self.write_page[window] = (torch.arange(batch, device=device) * per_sequence + (count - 1)).long()
        self.offset = offset
        super().__init__(layers=[FlashInferLayer(self, i, windows[i] != 0) for i in range(layers)])

    @staticmethod
    def sequences_in(budget, geometry, context, growth):
        """How many sequences a budget of `budget` bytes holds."""
        layers, kv_heads, head_dim, windows = geometry
        page_bytes = 2 * PAGE * kv_heads * head_dim * 2
        per_sequence = sum(_pages_per_sequence(context, w, growth) for w in windows) * page_bytes
        return int(budget // per_sequence)

    @property
    def nbytes(self):
        return sum(p.nbytes for p in self.pages)

    def get_seq_length(self, layer_idx=0):
        return self.context

    def get_mask_sizes(self, query_length, layer_idx=0):
        return self.context + query_length, 0

    def get_max_length(self, layer_idx=None):
        return -1

    @property
    def batch_size(self):
        return self.batch

    @property
    def is_compileable(self):
        return False

    def attend_layer(self, layer, q):
        """The decode of `q` ([batch, q_heads, head_dim]) over layer `layer`'s pages, nothing written."""
        return self.wrappers[self.windows[layer]].run(q, self.pages[layer])

    def _attend(self, layer, query, key, value, scaling, kwargs):
        batch, q_heads, tokens, head_dim = query.shape
        if tokens != 1 or batch != self.batch:
            raise ValueError(f"FlashInferCache decodes one token for each of its {self.batch} sequences, got a "
                             f"forward of {tokens} tokens for {batch}")
        if scaling is not None and not math.isclose(scaling, self.scale, rel_tol=1e-6):
            raise ValueError(f"FlashInferCache was planned with softmax scale {self.scale}, layer {layer} asks {scaling}")
        if kwargs.get("softcap") is not None:
            raise ValueError("FlashInferCache: attention logit soft-capping is not planned")
        pages, page = self.pages[layer], self.write_page[self.windows[layer]]
        pages[page, 0, self.offset] = key[:, :, 0]
        pages[page, 1, self.offset] = value[:, :, 0]
        return self.attend_layer(layer, query[:, :, 0]).unsqueeze(1), None


def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """The attention function of a ``FlashInferCache``: raises for any other cache."""
    current = _current.get()
    _current.set(None)
    if current is None:
        raise ValueError(f"attn_implementation {ATTENTION!r} reads a FlashInferCache only")
    owner, layer = current
    return owner._attend(layer, query, key, value, scaling, kwargs)


AttentionInterface.register(ATTENTION, attention)
AttentionMaskInterface.register(ATTENTION, lambda **arguments: None)  # causality and windows are the plan's
