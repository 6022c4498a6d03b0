// gaac.DeviceCache (a KvCache mirrored to the GPU) and gaac.DeviceKvCache (a paged cache that lives and
// grows on the GPU alone): decode attention (the fused GAAC kernel, or the BF16 twin for a bf16 cache),
// growth, finalize and decompression, on CUDA tensors passed through DLPack (PyTorch bfloat16 on the
// current device). Built where nvcc is found; elsewhere gaac.cuda_available() is False and both raise.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache.hpp"
#include "gaac/error.hpp"
#include "gaac/kv_cache.hpp"

#if GAAC_PYTHON_CUDA
#include "gaac/cuda.hpp"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace gaac::python {
namespace {

/// A CUDA array of any dtype.
using CudaArray = nb::ndarray<nb::device::cuda>;

#if GAAC_PYTHON_CUDA
/// Pointer to a contiguous bfloat16 CUDA array of `elements` elements; throws naming `what` otherwise.
uint16_t* bf16_pointer(const CudaArray& a, size_t elements, const std::string& what) {
  const nb::dlpack::dtype dt = a.dtype();
  if (dt.code != static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) || dt.bits != 16)
    throw Error(what + ": expected a bfloat16 CUDA tensor");
  size_t n = 1;
  int64_t stride = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.stride(i) != stride && a.shape(i) != 1) throw Error(what + ": expected a contiguous tensor");
    stride *= static_cast<int64_t>(a.shape(i));
    n *= a.shape(i);
  }
  if (n != elements) throw Error(what + ": expected " + std::to_string(elements) + " elements, got " + std::to_string(n));
  return static_cast<uint16_t*>(a.data());
}

/// Decode attention over `cache` for the bfloat16 CUDA tensors q and out ([sequences, q_heads, head_dim]);
/// `what` names the method in errors.
void attend_tensors(const cuda::DeviceCache& cache, const cuda::DeviceSequences& sequences,
                    cuda::DecodeWorkspace& workspace, int layer, const CudaArray& q, const CudaArray& out,
                    std::optional<float> scale, int blocks_per_split, int plan_tokens, uintptr_t stream,
                    const std::string& what) {
  const size_t n = static_cast<size_t>(sequences.sequences());
  const size_t head_dim = static_cast<size_t>(cache.view().geometry.head_dim);
  if (q.ndim() != 3 || q.shape(0) != n || q.shape(2) != head_dim)
    throw Error(what + ": q must be [sequences, q_heads, head_dim]");
  const int q_heads = static_cast<int>(q.shape(1));
  const size_t elements = n * static_cast<size_t>(q_heads) * head_dim;
  cuda::DecodeConfig config;
  config.layer = layer;
  config.q_heads = q_heads;
  config.softmax_scale = scale.value_or(0.0f);
  config.blocks_per_split = blocks_per_split;
  config.plan_tokens = plan_tokens;
  cuda::decode_attention(cache, sequences, config, bf16_pointer(q, elements, what + ": q"),
                         bf16_pointer(out, elements, what + ": out"), workspace, reinterpret_cast<cuda::Stream>(stream));
}

/// A cache on the device with the sequence table it was uploaded with.
struct DeviceMirror {
  std::unique_ptr<cuda::DeviceCache> cache;
  std::unique_ptr<cuda::DeviceSequences> sequences;
  std::vector<SequenceId> ids;
  std::vector<int> lengths;
  cuda::DecodeWorkspace workspace;
  int kv_heads = 0, head_dim = 0, layers = 0;
};
/// A cache made on the device with its reserved batch.
struct DeviceGrown {
  std::unique_ptr<cuda::DeviceCache> cache;
  std::unique_ptr<cuda::DeviceSequences> sequences;
  cuda::DecodeWorkspace workspace;
  uint64_t budget_bytes = 0;
  int kv_heads = 0, head_dim = 0, layers = 0;
};

/// `[sequences, kv_heads, tokens, head_dim]` bfloat16 CUDA rows (last dimension contiguous) as TokenRows.
cuda::TokenRows token_rows(const DeviceGrown& d, const CudaArray& k, const CudaArray& v) {
  const int n = d.sequences->sequences(), tokens = d.sequences->last_count();
  const auto check_one = [&](const CudaArray& a, const char* what) {
    const nb::dlpack::dtype dt = a.dtype();
    if (dt.code != static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) || dt.bits != 16)
      throw Error(std::string("DeviceKvCache.write: ") + what + " must be a bfloat16 CUDA tensor");
    if (a.ndim() != 4 || a.shape(0) != static_cast<size_t>(n) || a.shape(1) != static_cast<size_t>(d.kv_heads) ||
        a.shape(2) != static_cast<size_t>(tokens) || a.shape(3) != static_cast<size_t>(d.head_dim))
      throw Error(std::string("DeviceKvCache.write: ") + what + " must be [" + std::to_string(n) + ", " +
                  std::to_string(d.kv_heads) + ", " + std::to_string(tokens) + ", " + std::to_string(d.head_dim) +
                  "] (sequences, KV heads, the tokens of the last begin, head_dim)");
    if (a.stride(3) != 1) throw Error(std::string("DeviceKvCache.write: ") + what + "'s last dimension must be contiguous");
  };
  check_one(k, "k");
  check_one(v, "v");
  for (size_t i = 0; i < 3; ++i) {
    if (k.stride(i) != v.stride(i) && k.shape(i) > 1) throw Error("DeviceKvCache.write: k and v need the same strides");
  }
  // A dimension of extent 1 may carry any stride: give it one the kernel accepts.
  const auto stride = [&](size_t i, int64_t otherwise) {
    return k.shape(i) == 1 ? otherwise : static_cast<int64_t>(k.stride(i));
  };
  cuda::TokenRows r;
  r.k = static_cast<const uint16_t*>(k.data());
  r.v = static_cast<const uint16_t*>(v.data());
  r.token_stride = stride(2, d.head_dim);
  r.head_stride = stride(1, r.token_stride * tokens);
  r.sequence_stride = stride(0, r.head_stride * d.kv_heads);
  return r;
}
#else
struct DeviceMirror {};
struct DeviceGrown {};
#endif

}  // namespace

void bind_cuda(nb::module_& m) {
#if GAAC_PYTHON_CUDA
  m.def("cuda_available", &cuda::device_available, "True when gaac was built with CUDA and a GPU is present.");
  nb::class_<DeviceMirror>(m, "DeviceCache",
                           "A KvCache copied to the GPU (units, block table, bases) with the sequences it was "
                           "uploaded for; decode attention and decompression run there.")
      .def(
          "__init__",
          [](DeviceMirror* self, const KvCache& host, const std::vector<SequenceId>& sequences) {
            if (!cuda::device_available()) throw Error("DeviceCache: no CUDA device found");
            new (self) DeviceMirror();
            self->cache = std::make_unique<cuda::DeviceCache>(cuda::DeviceCache::upload(host));
            const SequenceTable table = host.sequence_table(sequences);
            self->sequences = std::make_unique<cuda::DeviceSequences>(cuda::DeviceSequences::upload(table.view()));
            self->ids = sequences;
            self->lengths.assign(table.lengths.begin(), table.lengths.end());
            self->kv_heads = host.geometry().kv_heads;
            self->head_dim = host.geometry().head_dim;
            self->layers = host.geometry().layers;
          },
          "cache"_a, "sequences"_a, "Copies `cache` and the table of `sequences` (in that order) to the device.")
      .def(
          "attend",
          [](DeviceMirror& d, int layer, const CudaArray& q, const CudaArray& out, std::optional<float> scale,
             int blocks_per_split, uintptr_t stream) {
            attend_tensors(*d.cache, *d.sequences, d.workspace, layer, q, out, scale, blocks_per_split, 0, stream,
                           "DeviceCache.attend");
          },
          "layer"_a, "q"_a, "out"_a, "scale"_a = nb::none(), "blocks_per_split"_a = 0, "stream"_a = 0,
          "Decode attention of one query per sequence (the newest token of each) over `layer`: q and out are "
          "bfloat16 CUDA tensors [sequences, q_heads, head_dim]; asynchronous on `stream` (a cudaStream_t as an "
          "int, e.g. torch.cuda.current_stream().cuda_stream; 0 the default stream). `blocks_per_split` (0: "
          "planned for the GPU, see plan()) fixes how the context is split over CTAs: a GAAC cache and a BF16 "
          "cache holding the same values give the same bits with the same split.")
      .def(
          "plan",
          [](const DeviceMirror& d, int layer, int q_heads) {
            cuda::DecodeConfig config;
            config.layer = layer;
            config.q_heads = q_heads;
            return cuda::plan_decode(*d.cache, *d.sequences, config).blocks_per_split;
          },
          "layer"_a, "q_heads"_a, "The blocks per split attend() chooses by itself for this cache and batch.")
      .def(
          "decompress",
          [](DeviceMirror& d, const CudaArray& k, const CudaArray& v, uintptr_t stream) {
            int longest = 0;
            for (const int len : d.lengths) longest = std::max(longest, len);
            const size_t elements = static_cast<size_t>(d.layers) * d.ids.size() * longest * d.kv_heads * d.head_dim;
            cuda::DenseLayout out;
            out.k = bf16_pointer(k, elements, "DeviceCache.decompress: k");
            out.v = bf16_pointer(v, elements, "DeviceCache.decompress: v");
            out.head_stride = d.head_dim;
            out.token_stride = static_cast<int64_t>(d.kv_heads) * d.head_dim;
            out.outer_stride = out.token_stride * longest;
            out.layer_stride = out.outer_stride * static_cast<int64_t>(d.ids.size());
            cuda::decompress_dense(*d.cache, *d.sequences, 0, d.layers, out, reinterpret_cast<cuda::Stream>(stream));
          },
          "k"_a, "v"_a, "stream"_a = 0,
          "Every value the cache holds for the sequences, as BF16, into k and v: contiguous bfloat16 CUDA tensors "
          "[layers, sequences, longest length, kv_heads, head_dim] (positions past a sequence's length, and tiles "
          "released by a sliding window, are left as they were).");
  nb::class_<DeviceGrown>(m, "DeviceKvCache",
                          "A paged KV cache made and grown on the GPU alone (no host copy): a batch of sequences in "
                          "lockstep, block rows reserved for max_tokens each. A step is begin(n), write(layer, k, v) "
                          "for every layer, attend(...) where needed, finalize(); every call is asynchronous on "
                          "`stream` and graph-safe (no host sync, no allocation once warm), so a whole decoding step "
                          "can be captured in a CUDA graph. Format 'gaac' holds compressed slots; 'bf16' is the twin. "
                          "Not thread-safe.")
      .def(
          "__init__",
          [](DeviceGrown* self, int layers, int kv_heads, int head_dim, uint64_t budget_bytes,
             const CalibrationTable* calibration, const std::string& format,
             const std::optional<std::vector<int>>& windows, int sequences, int max_tokens) {
            if (!cuda::device_available()) throw Error("DeviceKvCache: no CUDA device found");
            if (format != "gaac" && format != "bf16") throw Error("format must be 'gaac' or 'bf16', got '" + format + "'");
            CacheConfig c;
            c.geometry = {layers, kv_heads, head_dim, windows.value_or(std::vector<int>{})};
            c.format = format == "gaac" ? CacheFormat::gaac : CacheFormat::bf16;
            c.budget_bytes = budget_bytes;
            c.calibration = c.format == CacheFormat::gaac ? calibration : nullptr;
            new (self) DeviceGrown();
            self->cache = std::make_unique<cuda::DeviceCache>(cuda::DeviceCache::create(c));
            self->sequences = std::make_unique<cuda::DeviceSequences>(
                cuda::DeviceSequences::reserve(*self->cache, sequences, max_tokens));
            self->budget_bytes = budget_bytes;
            self->kv_heads = kv_heads, self->head_dim = head_dim, self->layers = layers;
          },
          "layers"_a, "kv_heads"_a, "head_dim"_a, "budget_bytes"_a, "calibration"_a = nb::none(), "format"_a = "gaac",
          "sliding_window"_a = nb::none(), "sequences"_a = 1, "max_tokens"_a = 4096,
          "Carves `budget_bytes` of GPU memory exactly as KvCache does; `calibration` is required for 'gaac'; "
          "`sliding_window` gives each layer's window in tokens (0: full attention).")
      .def(
          "begin",
          [](DeviceGrown& d, int count, uintptr_t stream) {
            cuda::begin_tokens(*d.cache, *d.sequences, count, reinterpret_cast<cuda::Stream>(stream));
          },
          "count"_a, "stream"_a = 0,
          "Adds `count` tokens to every sequence: opens the blocks they start (units from the device's free list) "
          "and frees what sliding windows no longer see. Raises when a sequence would pass max_tokens; running out "
          "of units is reported by check().")
      .def(
          "write",
          [](DeviceGrown& d, int layer, const CudaArray& k, const CudaArray& v, uintptr_t stream) {
            cuda::write_tokens(*d.cache, *d.sequences, layer, token_rows(d, k, v), reinterpret_cast<cuda::Stream>(stream));
          },
          "layer"_a, "k"_a, "v"_a, "stream"_a = 0,
          "Writes the K and V rows of the last begin's tokens into `layer`: bfloat16 CUDA tensors [sequences, "
          "kv_heads, tokens, head_dim] (transformers' key states; any strides, the last dimension contiguous).")
      .def(
          "finalize",
          [](DeviceGrown& d, uintptr_t stream) {
            cuda::finalize_completed(*d.cache, *d.sequences, reinterpret_cast<cuda::Stream>(stream));
          },
          "stream"_a = 0,
          "Encodes, in every layer, the blocks the last begin completed (call it after write() of every layer; "
          "nothing to do for 'bf16').")
      .def(
          "attend",
          [](DeviceGrown& d, int layer, const CudaArray& q, const CudaArray& out, std::optional<float> scale,
             int blocks_per_split, int plan_tokens, uintptr_t stream) {
            attend_tensors(*d.cache, *d.sequences, d.workspace, layer, q, out, scale, blocks_per_split, plan_tokens,
                           stream, "DeviceKvCache.attend");
          },
          "layer"_a, "q"_a, "out"_a, "scale"_a = nb::none(), "blocks_per_split"_a = 0, "plan_tokens"_a = 0,
          "stream"_a = 0,
          "Decode attention of one query per sequence (its newest token) over `layer`: q and out contiguous bfloat16 "
          "CUDA tensors [sequences, q_heads, head_dim]. `blocks_per_split` fixes the split (a 'gaac' and a 'bf16' "
          "cache of the same values give the same bits with the same split); `plan_tokens` plans the launch for "
          "sequences that long, so that a captured graph stays right while they grow up to it.")
      .def(
          "plan",
          [](const DeviceGrown& d, int layer, int q_heads, int plan_tokens) {
            cuda::DecodeConfig config;
            config.layer = layer;
            config.q_heads = q_heads;
            config.plan_tokens = plan_tokens;
            return cuda::plan_decode(*d.cache, *d.sequences, config).blocks_per_split;
          },
          "layer"_a, "q_heads"_a, "plan_tokens"_a = 0, "The blocks per split attend() chooses by itself.")
      .def(
          "check",
          [](const DeviceGrown& d) {
            if (d.cache->status() & cuda::DeviceCache::kOutOfUnits)
              throw CacheFull("DeviceKvCache: the budget ran out of units; the tiles begun since then are missing, so "
                              "the cache's contents are incomplete (a larger budget_bytes holds more)");
          },
          "Synchronises; raises CacheFullError if a begin() found too few free units since the cache was made.")
      .def_prop_ro(
          "length", [](const DeviceGrown& d) { return d.sequences->length(0); },
          "Tokens each sequence holds (as the host counted the begins).")
      .def(
          "note_replayed", [](DeviceGrown& d, int count) { d.sequences->note_begin(count); }, "count"_a,
          "Counts, on the host, one replay of a captured step that began `count` tokens (its begin() counted only "
          "the capture), so that length and plans follow the device.")
      .def(
          "usage",
          [](const DeviceGrown& d) {
            const cuda::DeviceCache& c = *d.cache;
            const PagedGeometry& g = c.view().geometry;
            const cuda::DeviceCache::TileCounts t = c.count_tiles();
            const uint64_t free = c.free_unit_count();
            const uint64_t rows = static_cast<uint64_t>(d.sequences->total_blocks());
            nb::dict u;
            u["budget_bytes"] = d.budget_bytes;
            u["unit_bytes"] = g.unit_bytes;
            u["units"] = c.units();
            u["units_free"] = free;
            u["compressed_tiles"] = t.compressed;
            u["raw_tiles"] = t.raw;
            u["resident_bytes"] = (c.units() - free) * g.unit_bytes + rows * g.entries_per_row() * 4;
            u["bf16_bytes"] = static_cast<uint64_t>(t.compressed + t.raw) * g.raw_tile_bytes();
            return u;
          },
          "Synchronises; the accounting: units in use and free, tiles by class (raw counts the open tails), "
          "resident bytes (units in use and the reserved rows' entries) and the BF16 bytes of the tiles held.");
#else
  m.def("cuda_available", [] { return false; }, "True when gaac was built with CUDA and a GPU is present.");
  nb::class_<DeviceMirror>(m, "DeviceCache", "Not available: this gaac was built without CUDA.")
      .def("__init__", [](DeviceMirror*, nb::args) { throw Error("DeviceCache: this gaac was built without CUDA"); });
  nb::class_<DeviceGrown>(m, "DeviceKvCache", "Not available: this gaac was built without CUDA.")
      .def("__init__", [](DeviceGrown*, nb::args) { throw Error("DeviceKvCache: this gaac was built without CUDA"); });
#endif
}

}  // namespace gaac::python
