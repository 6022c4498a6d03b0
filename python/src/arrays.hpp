// Arrays crossing between Python and the library: BF16 tensors `[tokens, kv_heads, head_dim]` from
// any DLPack producer (PyTorch bfloat16, NumPy uint16 holding BF16 bit patterns, ...) read in place,
// and arrays the library made handed to NumPy without a copy.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <string>
#include <vector>

#include "gaac/batch_kv_cache.hpp"
#include "gaac/fp8_dump.hpp"
#include "gaac/kv_dump.hpp"
#include "gaac/tensor_view.hpp"

namespace gaac::python {

/// A CPU array of any dtype, as nanobind receives it from a DLPack producer; read-only arrays
/// (np.frombuffer, memory maps opened 'r') too, since the library only reads it.
using AnyArray = nanobind::ndarray<nanobind::ro, nanobind::device::cpu>;
/// A NumPy array of BF16 bit patterns (uint16) owned by a capsule.
using Bf16Array = nanobind::ndarray<nanobind::numpy, uint16_t>;

/// Copies a `[tokens, kv_heads, head_dim]` BF16 (or uint16) array, any strides, into a KvTensor.
/// Throws gaac::Error naming `what` for another dtype, rank or device.
KvTensor tensor_from(const AnyArray& array, const std::string& what);

/// A view of a `[tokens, kv_heads, head_dim]` BF16 (or uint16) array in place: no copy; channels must
/// be contiguous. The array must outlive the view.
KvView view_from(const AnyArray& array, const std::string& what);

/// Hands the tensor's elements to NumPy (moved, not copied): an array `[tokens, kv_heads, head_dim]` of
/// uint16 BF16 bit patterns (torch.from_numpy(a).view(torch.bfloat16) makes it a bfloat16 tensor).
Bf16Array array_from(KvTensor&& tensor);

/// A NumPy array of FP8 bytes (uint8) owned by a capsule.
using U8Array = nanobind::ndarray<nanobind::numpy, uint8_t>;

/// Copies a `[tokens, kv_heads, head_dim]` uint8 array of FP8 bytes (torch float8 tensors arrive viewed as
/// uint8), any strides, into an Fp8KvTensor. Throws gaac::Error naming `what` otherwise.
Fp8KvTensor fp8_tensor_from(const AnyArray& array, const std::string& what);

/// Hands an FP8 tensor's bytes to NumPy (moved): a uint8 array `[tokens, kv_heads, head_dim]`.
U8Array array_from(Fp8KvTensor&& tensor);

/// An FP8 dump of `format` from per-layer K and V uint8 arrays and optional per-layer scales.
Fp8KvDump fp8_dump_from(const std::vector<AnyArray>& k, const std::vector<AnyArray>& v, ElementFormat format,
                        std::vector<float> k_scales, std::vector<float> v_scales, const std::string& what);

/// An array of any dtype on any device (CPU or CUDA), as nanobind receives it from a DLPack producer.
using DeviceArray = nanobind::ndarray<>;

/// A `[batch, heads, tokens, head_dim]` bfloat16 array, any strides with contiguous channels, read in
/// place: in CUDA device memory when `device` is true, else in host memory. Throws gaac::Error naming
/// `what` for another dtype, rank, layout or device.
BatchRows batch_rows_from(const DeviceArray& array, bool device, const std::string& what);
/// The same, written by the library (an output).
MutableBatchRows mutable_batch_rows_from(const DeviceArray& array, bool device, const std::string& what);

/// A cudaStream_t given as an int (0: the default stream; ignored on the CPU).
inline CUstream_st* stream_of(uintptr_t stream) { return reinterpret_cast<CUstream_st*>(stream); }

/// A dump from per-layer K and V arrays (`k[l]`, `v[l]`); `what` names the caller in errors.
KvDump dump_from(const std::vector<AnyArray>& k, const std::vector<AnyArray>& v, const std::string& what);

}  // namespace gaac::python
