// gaac.DeviceCache: a KvCache mirrored to the GPU, its decode attention (the fused GAAC kernel, or the
// BF16 twin for a bf16 cache) and its decompression, on CUDA tensors passed through DLPack (PyTorch
// bfloat16 on the current device). Built where nvcc is found; elsewhere gaac.cuda_available() is False
// and DeviceCache raises.
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

/// A cache on the device with the sequence table it was uploaded with.
struct DeviceMirror {
  std::unique_ptr<cuda::DeviceCache> cache;
  std::unique_ptr<cuda::DeviceSequences> sequences;
  std::vector<SequenceId> ids;
  std::vector<int> lengths;
  cuda::DecodeWorkspace workspace;
  int kv_heads = 0, head_dim = 0, layers = 0;
};
#else
struct DeviceMirror {};
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
            const size_t n = d.ids.size();
            if (q.ndim() != 3 || q.shape(0) != n || q.shape(2) != static_cast<size_t>(d.head_dim))
              throw Error("DeviceCache.attend: q must be [sequences, q_heads, head_dim]");
            const int q_heads = static_cast<int>(q.shape(1));
            const size_t elements = n * static_cast<size_t>(q_heads) * d.head_dim;
            cuda::DecodeConfig config;
            config.layer = layer;
            config.q_heads = q_heads;
            config.softmax_scale = scale.value_or(0.0f);
            config.blocks_per_split = blocks_per_split;
            cuda::decode_attention(*d.cache, *d.sequences, config, bf16_pointer(q, elements, "DeviceCache.attend: q"),
                                   bf16_pointer(out, elements, "DeviceCache.attend: out"), d.workspace,
                                   reinterpret_cast<cuda::Stream>(stream));
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
#else
  m.def("cuda_available", [] { return false; }, "True when gaac was built with CUDA and a GPU is present.");
  nb::class_<DeviceMirror>(m, "DeviceCache", "Not available: this gaac was built without CUDA.")
      .def("__init__", [](DeviceMirror*, nb::args) { throw Error("DeviceCache: this gaac was built without CUDA"); });
#endif
}

}  // namespace gaac::python
