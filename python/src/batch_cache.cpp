// gaac.BatchKvCache: the KV cache of a batch of sequences as a model's forward passes use it, on the
// CPU or (where gaac was built with CUDA) on a GPU, one class for both (gaac::BatchKvCache). Tensors
// are DLPack arrays (PyTorch bfloat16) where the cache lives; streams are cudaStream_t as ints.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <span>
#include <optional>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "cache.hpp"
#include "gaac/batch_kv_cache.hpp"
#include "gaac/error.hpp"

#if GAAC_PYTHON_CUDA
#include "gaac/cuda.hpp"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace gaac::python {
namespace {

/// gaac.BatchKvCache: holds the library's cache of either device.
struct BatchCache {
  std::unique_ptr<BatchKvCache> cache;
};

std::unique_ptr<BatchKvCache> make_batch_cache(const BatchCacheConfig& config, const std::string& device) {
  if (device == "cpu") return make_host_batch_kv_cache(config);
  if (device == "cuda") {
#if GAAC_PYTHON_CUDA
    return cuda::make_device_batch_kv_cache(config);
#else
    throw Error("BatchKvCache: device 'cuda' needs a gaac built with CUDA (nvcc found at install)");
#endif
  }
  throw Error("device must be 'cpu' or 'cuda', got '" + device + "'");
}

}  // namespace

void bind_batch_cache(nb::module_& m) {
  nb::class_<BatchCache>(
      m, "BatchKvCache",
      "The KV cache of a batch of sequences as a model's forward passes use it, where the model runs ('cpu': a "
      "KvCache attended by gaac.attend; 'cuda': a paged cache made and grown on the GPU, attended by the fused "
      "kernel). A forward is begin(tokens), then for every layer write(layer, k, v) and attend(layer, q, out). On "
      "a GPU every call is asynchronous on `stream` and graph-safe once warm, so a decoding step can be captured "
      "in a CUDA graph. Between forwards the batch can be edited: select, truncate, reset, clone. Format 'gaac' "
      "holds compressed slots; 'bf16' is the twin (same structure and kernels, "
      "uncompressed). Not thread-safe.")
      .def(
          "__init__",
          [](BatchCache* self, int layers, int kv_heads, int head_dim, uint64_t budget_bytes,
             const CalibrationTable* calibration, const std::string& format,
             const std::optional<std::vector<int>>& sliding_window, int batch, int max_tokens, const std::string& device,
             const std::string& attention_path, int blocks_per_split, int plan_tokens) {
            BatchCacheConfig c;
            c.cache.geometry = geometry_of(layers, kv_heads, head_dim, sliding_window);
            c.cache.format = format_of(format);
            c.cache.budget_bytes = budget_bytes;
            c.cache.calibration = c.cache.format == CacheFormat::gaac ? calibration : nullptr;
            c.batch = batch;
            c.max_tokens = max_tokens;
            c.path = path_of(attention_path);
            c.blocks_per_split = blocks_per_split;
            c.plan_tokens = plan_tokens;
            new (self) BatchCache{make_batch_cache(c, device)};
          },
          "layers"_a, "kv_heads"_a, "head_dim"_a, "budget_bytes"_a, "calibration"_a = nb::none(), "format"_a = "gaac",
          "sliding_window"_a = nb::none(), "batch"_a = 1, "max_tokens"_a = 4096, "device"_a = "cpu",
          "attention_path"_a = "fused", "blocks_per_split"_a = 0, "plan_tokens"_a = 0,
          "Carves `budget_bytes` (on the GPU for device 'cuda'); `calibration` is required for 'gaac'; "
          "`sliding_window` gives each layer's window in tokens (0: full attention); `max_tokens` is each sequence's "
          "room in the block table. CPU: `attention_path` 'fused' or 'reference'. GPU: `blocks_per_split` fixes "
          "how the context is split over CTAs (0: planned; a 'gaac' and a 'bf16' cache of the same values give the "
          "same bits with the same value), `plan_tokens` plans every launch for sequences that long (for a step "
          "captured in a CUDA graph and replayed while they grow).")
      .def(
          "begin",
          [](BatchCache& c, int tokens, const std::optional<std::vector<uint8_t>>& valid, uintptr_t stream,
             bool attended) {
            c.cache->begin(tokens, valid ? std::span<const uint8_t>(*valid) : std::span<const uint8_t>(),
                           stream_of(stream), attended);
          },
          "tokens"_a, "valid"_a = nb::none(), "stream"_a = 0, "attended"_a = true,
          "Starts a forward of `tokens` new tokens per sequence (after the previous one wrote every layer). `valid`: "
          "None (every token real) or batch × tokens flags, sequence after sequence, 0 for a pad token (never stored "
          "nor attended; its attention output is zero). `attended` False: the forward's queries are attended elsewhere (a "
          "prompt over its own rows, a fill), so a GPU cache keeps only what its newest token sees in sliding-window "
          "layers (and attend raises where a query needs more). Raises CacheFullError when they do not fit (on a GPU "
          "not while `stream` captures a graph: see check(); on the CPU the previous forward's rows are appended here, "
          "and it is their room that is checked).")
      .def(
          "write",
          [](BatchCache& c, int layer, const DeviceArray& k, const DeviceArray& v, uintptr_t stream) {
            const bool device = c.cache->in_device_memory();
            const BatchRows kr = batch_rows_from(k, device, "write: k");
            const BatchRows vr = batch_rows_from(v, device, "write: v");
            c.cache->write(layer, kr, vr, stream_of(stream));
          },
          "layer"_a, "k"_a, "v"_a, "stream"_a = 0,
          "The forward's K and V rows of `layer`: bfloat16 tensors [batch, kv_heads, tokens, head_dim] "
          "(transformers' key and value states; any strides, channels contiguous) on the cache's device.")
      .def(
          "attend",
          [](BatchCache& c, int layer, const DeviceArray& q, const DeviceArray& out, std::optional<float> scale,
             uintptr_t stream) {
            const bool device = c.cache->in_device_memory();
            const BatchRows qr = batch_rows_from(q, device, "attend: q");
            const MutableBatchRows o = mutable_batch_rows_from(out, device, "attend: out");
            std::optional<nb::gil_scoped_release> release;  // the CPU computes: other threads may run
            if (!device) release.emplace();
            c.cache->attend(layer, qr, o, scale.value_or(0.0f), stream_of(stream));
          },
          "layer"_a, "q"_a, "out"_a, "scale"_a = nb::none(), "stream"_a = 0,
          "Attention of the forward's queries of `layer` (after its write): q and out bfloat16 [batch, q_heads, "
          "tokens, head_dim] (any strides, channels contiguous; out may be a transposed view of a [batch, tokens, "
          "q_heads, head_dim] tensor). Query i of a sequence attends to its positions up to length - tokens + i, "
          "within the layer's sliding window; a pad query's output is zero. `scale` defaults to 1/sqrt(head_dim). On a "
          "GPU a decoding step (one token per sequence, every one real, q and out contiguous) is one launch per "
          "layer; any other forward attends each query as a sequence of its own.")
      .def_prop_ro(
          "lengths",
          [](const BatchCache& c) {
            std::vector<int> out;
            for (int b = 0; b < c.cache->batch(); ++b) out.push_back(c.cache->length(b));
            return out;
          },
          "Tokens each sequence holds (its real ones; the running forward's included).")
      .def(
          "select", [](BatchCache& c, const std::vector<int>& sources) { c.cache->select(sources); }, "sources"_a,
          "Between forwards: the batch becomes len(sources) sequences, sequence i holding what sequence sources[i] "
          "held (a further use of a sequence is a fork: complete blocks shared); unnamed sequences are freed. Raises "
          "CacheFullError, changing nothing, when the forks' open blocks do not fit.")
      .def(
          "truncate", [](BatchCache& c, const std::vector<int>& lengths) { c.cache->truncate(lengths); }, "lengths"_a,
          "Between forwards: cuts sequence b back to its first lengths[b] tokens (bit for bit as if only they had been "
          "appended). Raises GaacError for a length past a sequence's or one a sliding window can no longer serve.")
      .def(
          "reset", [](BatchCache& c) { c.cache->reset(); }, "Empties every sequence; the whole budget is free again.")
      .def(
          "clone", [](const BatchCache& c) { return BatchCache{c.cache->clone()}; },
          "A deep copy: the same sequences and contents, in memory of its own.")
      .def_prop_ro("forward_tokens", [](const BatchCache& c) { return c.cache->forward_tokens(); },
                   "Tokens per sequence of the running (or last) forward, pads included (0 after an edit).")
      .def_prop_ro("batch", [](const BatchCache& c) { return c.cache->batch(); }, "Sequences in the batch.")
      .def_prop_ro("layers", [](const BatchCache& c) { return c.cache->layers(); }, "Layers of the model.")
      .def_prop_ro("device", [](const BatchCache& c) { return c.cache->in_device_memory() ? "cuda" : "cpu"; },
                   "'cpu' or 'cuda': where rows, queries and outputs live.")
      .def(
          "usage", [](const BatchCache& c) { return usage_dict(c.cache->usage()); },
          "Memory and contents (synchronises a GPU), as KvCache.usage() reports them.")
      .def(
          "check", [](const BatchCache& c) { c.cache->check(); },
          "Synchronises a GPU; raises CacheFullError if a begin() found too few free units since the cache was made.")
      .def(
          "note_replayed", [](BatchCache& c, int count) { c.cache->note_replayed(count); }, "count"_a,
          "GPU: counts on the host one replay of a captured step that began `count` tokens (the capture's begin() "
          "counted only itself), so that length and plans follow the device.");
}

}  // namespace gaac::python
