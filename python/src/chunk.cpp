// gaac.ChunkCodec: KV chunk objects (docs/format.md, section 15) from and to DLPack arrays shaped as
// LMCache holds a chunk, `[2, layers, tokens, kv_heads · head_dim]` bfloat16 (or the chunk's dense bytes), and
// flat uint8 buffers; on the CPU (the GIL released while the library works) or, for CUDA arrays, on the GPU.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "arrays.hpp"
#include "cache.hpp"
#include "gaac/chunk.hpp"
#include "gaac/error.hpp"

#if GAAC_PYTHON_CUDA
#include "gaac/cuda.hpp"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace gaac::python {
namespace {

/// A read-only array of any dtype on any device.
using ReadArray = nb::ndarray<nb::ro>;

/// The chunk codecs of one calibration: the CPU's, and the GPU's once a CUDA array comes.
struct Codecs {
  ChunkCodec host;
#if GAAC_PYTHON_CUDA
  std::mutex device_mutex;
  std::unique_ptr<cuda::ChunkCodec> device;
  const cuda::ChunkCodec& on_device() {
    const std::lock_guard lock(device_mutex);
    if (!device) device = std::make_unique<cuda::ChunkCodec>(host.calibration(), host.options());
    return *device;
  }
#endif
};

bool is_cuda(int device_type) {
  if (device_type == nb::device::cuda::value) return true;
  if (device_type == nb::device::cpu::value) return false;
  throw Error("chunk arrays must be in host (CPU) or CUDA device memory");
}

/// The chunk view of a `[2, layers, tokens, kv_heads · head_dim]` bfloat16 (or uint16) array, any
/// strides with each token's row contiguous; `head_dim` splits the row into heads.
template <class Element, class Array>
BasicChunkView<Element> chunk_view_of(const Array& a, int head_dim, const std::string& what) {
  const nb::dlpack::dtype dt = a.dtype();
  const bool bf16 = dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) && dt.bits == 16 && dt.lanes == 1;
  const bool u16 = dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::UInt) && dt.bits == 16 && dt.lanes == 1;
  if (!bf16 && !u16) throw Error(what + ": expected a bfloat16 (or uint16) array");
  if (a.ndim() != 4 || a.shape(0) != 2) {
    throw Error(what + ": expected a chunk [2, layers, tokens, kv_heads · head_dim] (K and V), got " + std::to_string(a.ndim()) +
                " dimensions" + (a.ndim() > 0 ? " starting with " + std::to_string(a.shape(0)) : ""));
  }
  for (size_t i = 0; i < 4; ++i) {
    if (a.shape(i) >= (size_t{1} << 31) || a.stride(i) < 0) throw Error(what + ": shape or strides out of range");
  }
  if (a.stride(3) != 1 && a.shape(3) > 1) throw Error(what + ": each token's row must be contiguous");
  if (a.shape(3) % static_cast<size_t>(head_dim) != 0) {
    throw Error(what + ": rows of " + std::to_string(a.shape(3)) + " elements are not heads of " + std::to_string(head_dim));
  }
  const ChunkGeometry g{static_cast<int>(a.shape(1)), static_cast<int>(a.shape(3) / static_cast<size_t>(head_dim)), head_dim,
                        static_cast<int>(a.shape(2))};
  return {static_cast<Element*>(a.data()), g, static_cast<size_t>(a.stride(0)), static_cast<size_t>(a.stride(1)),
          static_cast<size_t>(a.stride(2))};
}

/// A flat byte buffer: a contiguous uint8 array (any shape) on the chunk's device.
template <class Array>
std::span<uint8_t> bytes_of(const Array& a, bool cuda, const std::string& what) {
  const nb::dlpack::dtype dt = a.dtype();
  if (dt.bits != 8 || dt.lanes != 1 || (dt.code != static_cast<uint8_t>(nb::dlpack::dtype_code::UInt) &&
                                         dt.code != static_cast<uint8_t>(nb::dlpack::dtype_code::Int))) {
    throw Error(what + ": expected a uint8 array");
  }
  if (is_cuda(a.device_type()) != cuda) throw Error(what + ": expected it where the chunk is (" + (cuda ? "CUDA" : "CPU") + ")");
  int64_t stride = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.stride(i) != stride && a.shape(i) != 1) throw Error(what + ": expected a contiguous array");
    stride *= static_cast<int64_t>(a.shape(i));
  }
  return {static_cast<uint8_t*>(const_cast<void*>(static_cast<const void*>(a.data()))), a.size()};
}

/// The chunk view of an array a codec of `calibration` takes: `[2, layers, tokens, kv_heads · head_dim]` as
/// chunk_view_of reads it, or the chunk's bytes as a contiguous 1-D uint8 array (as LMCache's memory objects hold
/// them: no view to build in Python), dense, of the calibration's layers and heads and as many tokens as its size
/// holds whole.
template <class Element, class Array>
BasicChunkView<Element> chunk_view_for(const Array& a, const CalibrationTable& calibration, const std::string& what) {
  const nb::dlpack::dtype dt = a.dtype();
  if (a.ndim() != 1 || dt.code != static_cast<uint8_t>(nb::dlpack::dtype_code::UInt) || dt.bits != 8 || dt.lanes != 1)
    return chunk_view_of<Element>(a, calibration.head_dim(), what);
  const std::span<uint8_t> bytes = bytes_of(a, is_cuda(a.device_type()), what);
  const size_t token_bytes = 2 * sizeof(uint16_t) * static_cast<size_t>(calibration.layers()) *
                             static_cast<size_t>(calibration.kv_heads()) * static_cast<size_t>(calibration.head_dim());
  if (bytes.empty() || bytes.size() % token_bytes != 0 || bytes.size() / token_bytes >= (size_t{1} << 31)) {
    throw Error(what + ": " + std::to_string(bytes.size()) + " bytes are not a chunk of whole tokens of the calibration's geometry (" +
                std::to_string(token_bytes) + " bytes a token)");
  }
  if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(uint16_t) != 0) throw Error(what + ": the chunk's bytes must be 2-byte aligned");
  const ChunkGeometry g{calibration.layers(), calibration.kv_heads(), calibration.head_dim(), static_cast<int>(bytes.size() / token_bytes)};
  return dense_chunk_view(reinterpret_cast<Element*>(bytes.data()), g);
}

#if GAAC_PYTHON_CUDA
/// The views of a batch's CUDA chunks, and its buffers' addresses and sizes (each list as long as given).
template <class Element, class ChunkArray, class BytesArray>
struct BatchViews {
  std::vector<BasicChunkView<Element>> chunks;
  std::vector<uint8_t*> buffers;
  std::vector<size_t> sizes;
  std::vector<std::string_view> keys;

  BatchViews(const std::vector<ChunkArray>& chunk_arrays, const std::vector<BytesArray>& buffer_arrays,
             const std::vector<std::string>& key_strings, const CalibrationTable& calibration, const std::string& what)
      : keys(key_strings.begin(), key_strings.end()) {
    for (size_t i = 0; i < chunk_arrays.size(); ++i) {
      if (!is_cuda(chunk_arrays[i].device_type())) throw Error(what + ": CUDA chunks only (a CPU chunk is coded one at a time)");
      chunks.push_back(chunk_view_for<Element>(chunk_arrays[i], calibration, what + ": chunk " + std::to_string(i)));
    }
    for (size_t i = 0; i < buffer_arrays.size(); ++i) {
      const std::span<uint8_t> bytes = bytes_of(buffer_arrays[i], true, what + ": buffer " + std::to_string(i));
      buffers.push_back(bytes.data());
      sizes.push_back(bytes.size());
    }
  }
};
#endif

}  // namespace

void bind_chunk(nb::module_& m) {
  nb::class_<Codecs>(m, "ChunkCodec",
                     "KV chunk objects (docs/format.md, section 15) of one model's cache with one calibration: a chunk "
                     "[2, layers, tokens, kv_heads * head_dim] (bfloat16, K then V, as LMCache holds it) to one "
                     "self-describing, checksummed object and back, bit for bit. A chunk may also be given as its "
                     "bytes (a contiguous 1-D uint8 array holding the dense chunk: the calibration's layers and heads, "
                     "tokens from its size). CPU arrays are coded on `threads` threads, CUDA arrays on the GPU (on "
                     "`stream`).")
      .def(
          "__init__",
          [](Codecs* self, const CalibrationTable& calibration, int threads, double object_ratio) {
            new (self) Codecs{ChunkCodec(calibration, {threads, object_ratio})};
          },
          "calibration"_a, "threads"_a = 1, "object_ratio"_a = 0.0,
          "`object_ratio` 0: objects take their own size; otherwise every object of a chunk size takes exactly "
          "BF16 bytes / object_ratio (rounded up to 64), for stores that read back exactly the bytes they were told, "
          "and a chunk that does not fit is refused with CacheFullError.")
      .def_prop_ro("calibration", [](const Codecs& c) { return c.host.calibration(); }, "The calibration.")
      .def_prop_ro("threads", [](const Codecs& c) { return c.host.options().threads; }, "CPU threads per chunk.")
      .def_prop_ro("object_ratio", [](const Codecs& c) { return c.host.options().object_ratio; }, "See __init__.")
      .def_prop_ro(
          "calibration_id",
          [](const Codecs& c) {
            char text[17];
            std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(c.host.calibration_id()));
            return std::string(text);
          },
          "The calibration's identity, as objects record it (16 hex digits).")
      .def("object_bytes", [](const Codecs& c, int tokens) { return c.host.object_bytes(tokens); }, "tokens"_a,
           "Bytes encode() needs for a chunk of `tokens` tokens: the fixed object size, or the most an object can take.")
      .def(
          "encode",
          [](Codecs& c, const ReadArray& chunk, const nb::ndarray<>& out, const std::string& key, uintptr_t stream) {
            const bool cuda = is_cuda(chunk.device_type());
            const ChunkView view = chunk_view_for<const uint16_t>(chunk, c.host.calibration(), "encode: chunk");
            const std::span<uint8_t> bytes = bytes_of(out, cuda, "encode: out");
            if (cuda) {
#if GAAC_PYTHON_CUDA
              const cuda::ChunkCodec& device = c.on_device();
              nb::gil_scoped_release release;
              return device.encode(view, key, bytes.data(), bytes.size(), stream_of(stream));
#else
              throw Error("encode: a CUDA chunk needs a gaac built with CUDA (nvcc found at install)");
#endif
            }
            nb::gil_scoped_release release;
            return c.host.encode(view, key, bytes);
          },
          "chunk"_a, "out"_a, "key"_a, "stream"_a = 0,
          "Writes the object of `chunk`, stored under `key` (bytes it records a hash of, checked when read), to the "
          "start of `out` (uint8, on the chunk's device, at least object_bytes() long) and returns its size.")
      .def(
          "decode",
          [](Codecs& c, const ReadArray& object, const nb::ndarray<>& chunk, const std::string& key, uintptr_t stream) {
            const bool cuda = is_cuda(chunk.device_type());
            const MutableChunkView view = chunk_view_for<uint16_t>(chunk, c.host.calibration(), "decode: chunk");
            const std::span<uint8_t> bytes = bytes_of(object, cuda, "decode: object");
            if (cuda) {
#if GAAC_PYTHON_CUDA
              const cuda::ChunkCodec& device = c.on_device();
              nb::gil_scoped_release release;
              device.decode(bytes.data(), bytes.size(), key, view, stream_of(stream));
              return;
#else
              throw Error("decode: a CUDA chunk needs a gaac built with CUDA (nvcc found at install)");
#endif
            }
            nb::gil_scoped_release release;
            c.host.decode(std::span<const uint8_t>(bytes), key, view);
          },
          "object"_a, "chunk"_a, "key"_a, "stream"_a = 0,
          "Reads the object at the start of `object` (uint8; bytes past its end are not looked at) into `chunk`, "
          "after checking all of it: container, checksums, calibration, key, geometry, every tile. Raises GaacError "
          "saying what is wrong.")
      .def(
          "encode_batch",
          [](Codecs& c, const std::vector<ReadArray>& chunks, const std::vector<nb::ndarray<>>& outs,
             const std::vector<std::string>& keys, uintptr_t stream) {
#if GAAC_PYTHON_CUDA
            const BatchViews<const uint16_t, ReadArray, nb::ndarray<>> views(chunks, outs, keys, c.host.calibration(), "encode_batch");
            const cuda::ChunkCodec& device = c.on_device();
            nb::gil_scoped_release release;
            return device.encode_batch(views.chunks, views.keys, views.buffers, views.sizes, stream_of(stream));
#else
            (void)c, (void)chunks, (void)outs, (void)keys, (void)stream;
            throw Error("encode_batch: CUDA chunks need a gaac built with CUDA (nvcc found at install)");
            return std::vector<size_t>{};
#endif
          },
          "chunks"_a, "outs"_a, "keys"_a, "stream"_a = 0,
          "encode() of CUDA chunks[i] under keys[i] into outs[i], up to 8 chunks coded by the same launches and "
          "waited for once (not once a chunk); returns the objects' sizes.")
      .def(
          "decode_batch",
          [](Codecs& c, const std::vector<ReadArray>& objects, const std::vector<nb::ndarray<>>& chunks,
             const std::vector<std::string>& keys, uintptr_t stream) {
#if GAAC_PYTHON_CUDA
            const BatchViews<uint16_t, nb::ndarray<>, ReadArray> views(chunks, objects, keys, c.host.calibration(), "decode_batch");
            const std::vector<const uint8_t*> buffers(views.buffers.begin(), views.buffers.end());
            const cuda::ChunkCodec& device = c.on_device();
            nb::gil_scoped_release release;
            device.decode_batch(buffers, views.sizes, views.keys, views.chunks, stream_of(stream));
#else
            (void)c, (void)objects, (void)chunks, (void)keys, (void)stream;
            throw Error("decode_batch: CUDA chunks need a gaac built with CUDA (nvcc found at install)");
#endif
          },
          "objects"_a, "chunks"_a, "keys"_a, "stream"_a = 0,
          "decode() of each CUDA object into chunks[i], enqueued as encode_batch() enqueues; the first object found "
          "wrong raises GaacError naming it (object i of n).");

  m.def(
      "chunk_object_bytes",
      [](int layers, int kv_heads, int head_dim, int tokens, double object_ratio) {
        return chunk_object_bytes({layers, kv_heads, head_dim, tokens}, {1, object_ratio});
      },
      "layers"_a, "kv_heads"_a, "head_dim"_a, "tokens"_a, "object_ratio"_a = 0.0,
      "ChunkCodec.object_bytes() without a calibration: the bytes an object of a chunk of this geometry takes "
      "(object_ratio > 0), or the most it can take (0).");
  m.def(
      "calibrate_chunk",
      [](const ReadArray& chunk, int head_dim) {
        if (is_cuda(chunk.device_type())) throw Error("calibrate_chunk: the chunk must be in host memory");
        const ChunkView view = chunk_view_of<const uint16_t>(chunk, head_dim, "calibrate_chunk");
        nb::gil_scoped_release release;
        return calibrate_chunk(view);
      },
      "chunk"_a, "head_dim"_a,
      "Learns a calibration from one chunk [2, layers, tokens, kv_heads * head_dim] (bfloat16, in host memory).");
}

}  // namespace gaac::python
