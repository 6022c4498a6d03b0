// gaac.KvCacheMirror (a KvCache copied to the GPU with some of its sequences: decode attention and
// decompression there) and gaac.cuda_available, on CUDA tensors passed through DLPack (PyTorch
// bfloat16 on the current device). Built where nvcc is found; elsewhere cuda_available() is False and
// KvCacheMirror raises.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "arrays.hpp"
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
#endif

}  // namespace

void bind_cuda(nb::module_& m) {
#if GAAC_PYTHON_CUDA
  m.def("cuda_available", &cuda::device_available, "True when gaac was built with CUDA and a GPU is present.");
  nb::class_<cuda::KvCacheMirror>(m, "KvCacheMirror",
                                  "A KvCache copied to the GPU (units, block table, bases) with the table of some of "
                                  "its sequences, for decode attention and decompression there. A copy: later changes "
                                  "of the KvCache are not seen.")
      .def(
          "__init__",
          [](cuda::KvCacheMirror* self, const KvCache& host, const std::vector<SequenceId>& sequences) {
            if (!cuda::device_available()) throw Error("KvCacheMirror: no CUDA device found");
            new (self) cuda::KvCacheMirror(host, sequences);
          },
          "cache"_a, "sequences"_a, "Copies `cache` and the table of `sequences` (in that order) to the device.")
      .def(
          "attend",
          [](cuda::KvCacheMirror& mirror, int layer, const CudaArray& q, const CudaArray& out, std::optional<float> scale,
             int blocks_per_split, uintptr_t stream) {
            const auto n = static_cast<size_t>(mirror.sequences());
            const auto head_dim = static_cast<size_t>(mirror.memory().geometry().head_dim);
            if (q.ndim() != 3 || q.shape(0) != n || q.shape(2) != head_dim)
              throw Error("KvCacheMirror.attend: q must be [sequences, q_heads, head_dim]");
            const auto q_heads = static_cast<int>(q.shape(1));
            const size_t elements = n * static_cast<size_t>(q_heads) * head_dim;
            mirror.attend(layer, bf16_pointer(q, elements, "KvCacheMirror.attend: q"),
                          bf16_pointer(out, elements, "KvCacheMirror.attend: out"), q_heads, scale.value_or(0.0f),
                          blocks_per_split, stream_of(stream));
          },
          "layer"_a, "q"_a, "out"_a, "scale"_a = nb::none(), "blocks_per_split"_a = 0, "stream"_a = 0,
          "Decode attention of one query per sequence (the newest token of each) over `layer`: q and out are "
          "bfloat16 CUDA tensors [sequences, q_heads, head_dim]; asynchronous on `stream` (a cudaStream_t as an "
          "int, e.g. torch.cuda.current_stream().cuda_stream; 0 the default stream). `blocks_per_split` (0: "
          "planned for the GPU, see planned_blocks_per_split()) fixes how the context is split over CTAs: a GAAC "
          "cache and a BF16 cache holding the same values give the same bits with the same split.")
      .def("planned_blocks_per_split", &cuda::KvCacheMirror::planned_blocks_per_split, "layer"_a, "q_heads"_a,
           "The blocks per split attend() plans by itself for `layer` with `q_heads` query heads.")
      .def(
          "decompress",
          [](const cuda::KvCacheMirror& mirror, const CudaArray& k, const CudaArray& v, uintptr_t stream) {
            const PagedGeometry& g = mirror.memory().geometry();
            const size_t elements = static_cast<size_t>(g.layers) * mirror.sequences() * mirror.longest() * g.kv_heads *
                                    g.head_dim;
            mirror.decompress(bf16_pointer(k, elements, "KvCacheMirror.decompress: k"),
                              bf16_pointer(v, elements, "KvCacheMirror.decompress: v"), stream_of(stream));
          },
          "k"_a, "v"_a, "stream"_a = 0,
          "Every value the mirror holds for its sequences, as BF16, into k and v: contiguous bfloat16 CUDA tensors "
          "[layers, sequences, longest length, kv_heads, head_dim] (positions past a sequence's length, and tiles "
          "released by a sliding window, are left as they were).");
#else
  m.def("cuda_available", [] { return false; }, "True when gaac was built with CUDA and a GPU is present.");
  struct Unavailable {};
  nb::class_<Unavailable>(m, "KvCacheMirror", "Not available: this gaac was built without CUDA.")
      .def("__init__", [](Unavailable*, nb::args) { throw Error("KvCacheMirror: this gaac was built without CUDA"); });
#endif
}

}  // namespace gaac::python
