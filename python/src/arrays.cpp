#include "arrays.hpp"

#include <cstring>
#include <utility>

#include "gaac/error.hpp"

namespace nb = nanobind;

namespace gaac::python {

namespace {

/// Throws unless `a` is a 3-D array of 16-bit elements, BF16 or uint16, of a sane shape.
void check_bf16_array(const AnyArray& a, const std::string& what) {
  const nb::dlpack::dtype dt = a.dtype();
  const bool bf16 = dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) && dt.bits == 16 && dt.lanes == 1;
  const bool u16 = dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::UInt) && dt.bits == 16 && dt.lanes == 1;
  if (!bf16 && !u16) throw Error(what + ": expected a bfloat16 (or uint16) array");
  if (a.ndim() != 3) throw Error(what + ": expected [tokens, kv_heads, head_dim], got " + std::to_string(a.ndim()) + " dimensions");
  if (a.shape(0) >= (size_t{1} << 31) || a.shape(1) > 4096 || a.shape(2) > 4096) throw Error(what + ": shape out of range");
}

}  // namespace

KvView view_from(const AnyArray& a, const std::string& what) {
  check_bf16_array(a, what);
  if (a.stride(2) != 1 || a.stride(0) < 0 || a.stride(1) < 0)
    throw Error(what + ": the channels of a head must be contiguous (and strides non-negative)");
  return {static_cast<const uint16_t*>(a.data()), static_cast<int>(a.shape(0)), static_cast<int>(a.shape(1)),
          static_cast<int>(a.shape(2)), static_cast<size_t>(a.stride(0)), static_cast<size_t>(a.stride(1))};
}

KvTensor tensor_from(const AnyArray& a, const std::string& what) {
  check_bf16_array(a, what);
  KvTensor t;
  t.tokens = static_cast<int>(a.shape(0));
  t.kv_heads = static_cast<int>(a.shape(1));
  t.head_dim = static_cast<int>(a.shape(2));
  t.data.resize(t.elements());
  const auto* src = static_cast<const uint16_t*>(a.data());
  const int64_t s0 = a.stride(0), s1 = a.stride(1), s2 = a.stride(2);
  size_t i = 0;
  for (int tok = 0; tok < t.tokens; ++tok)
    for (int h = 0; h < t.kv_heads; ++h) {
      const uint16_t* row = src + tok * s0 + h * s1;
      if (s2 == 1) {
        std::memcpy(t.data.data() + i, row, static_cast<size_t>(t.head_dim) * 2);
        i += static_cast<size_t>(t.head_dim);
      } else {
        for (int c = 0; c < t.head_dim; ++c) t.data[i++] = row[c * s2];
      }
    }
  return t;
}

Bf16Array array_from(KvTensor&& tensor) {
  auto* owned = new std::vector<uint16_t>(std::move(tensor.data));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<uint16_t>*>(p); });
  const size_t shape[3] = {static_cast<size_t>(tensor.tokens), static_cast<size_t>(tensor.kv_heads),
                           static_cast<size_t>(tensor.head_dim)};
  return Bf16Array(owned->data(), 3, shape, owner);
}

KvDump dump_from(const std::vector<AnyArray>& k, const std::vector<AnyArray>& v, const std::string& what) {
  if (k.size() != v.size()) {
    throw Error(what + ": " + std::to_string(k.size()) + " K layers but " + std::to_string(v.size()) + " V layers");
  }
  if (k.empty()) throw Error(what + ": no layers");
  KvDump d;
  for (size_t l = 0; l < k.size(); ++l) {
    const std::string where = what + ": layer " + std::to_string(l);
    d.layers.push_back({tensor_from(k[l], where + " K"), tensor_from(v[l], where + " V")});
  }
  validate_dump(d);
  return d;
}

Fp8KvTensor fp8_tensor_from(const AnyArray& a, const std::string& what) {
  const nb::dlpack::dtype dt = a.dtype();
  if (dt.code != static_cast<uint8_t>(nb::dlpack::dtype_code::UInt) || dt.bits != 8 || dt.lanes != 1) {
    throw Error(what + ": expected FP8 bytes (a torch.float8_e4m3fn / float8_e5m2 tensor, or a uint8 array)");
  }
  if (a.ndim() != 3) throw Error(what + ": expected [tokens, kv_heads, head_dim], got " + std::to_string(a.ndim()) + " dimensions");
  if (a.shape(0) >= (size_t{1} << 31) || a.shape(1) > 4096 || a.shape(2) > 4096) throw Error(what + ": shape out of range");
  Fp8KvTensor t;
  t.tokens = static_cast<int>(a.shape(0));
  t.kv_heads = static_cast<int>(a.shape(1));
  t.head_dim = static_cast<int>(a.shape(2));
  t.data.resize(t.elements());
  const auto* src = static_cast<const uint8_t*>(a.data());
  const int64_t s0 = a.stride(0), s1 = a.stride(1), s2 = a.stride(2);
  size_t i = 0;
  for (int tok = 0; tok < t.tokens; ++tok) {
    for (int h = 0; h < t.kv_heads; ++h) {
      const uint8_t* row = src + tok * s0 + h * s1;
      for (int c = 0; c < t.head_dim; ++c) t.data[i++] = row[c * s2];
    }
  }
  return t;
}

U8Array array_from(Fp8KvTensor&& tensor) {
  auto* owned = new std::vector<uint8_t>(std::move(tensor.data));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
  const size_t shape[3] = {static_cast<size_t>(tensor.tokens), static_cast<size_t>(tensor.kv_heads),
                           static_cast<size_t>(tensor.head_dim)};
  return U8Array(owned->data(), 3, shape, owner);
}

Fp8KvDump fp8_dump_from(const std::vector<AnyArray>& k, const std::vector<AnyArray>& v, ElementFormat format,
                        std::vector<float> k_scales, std::vector<float> v_scales, const std::string& what) {
  if (k.size() != v.size()) {
    throw Error(what + ": " + std::to_string(k.size()) + " K layers but " + std::to_string(v.size()) + " V layers");
  }
  if (k.empty()) throw Error(what + ": no layers");
  Fp8KvDump d;
  d.format = format;
  for (size_t l = 0; l < k.size(); ++l) {
    const std::string where = what + ": layer " + std::to_string(l);
    d.layers.push_back({fp8_tensor_from(k[l], where + " K"), fp8_tensor_from(v[l], where + " V")});
  }
  d.k_scales = std::move(k_scales);
  d.v_scales = std::move(v_scales);
  validate_dump(d);
  return d;
}

MutableBatchRows mutable_batch_rows_from(const DeviceArray& a, bool device, const std::string& what) {
  const nb::dlpack::dtype dt = a.dtype();
  if (dt.code != static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) || dt.bits != 16 || dt.lanes != 1)
    throw Error(what + ": expected a bfloat16 tensor");
  const bool cuda = a.device_type() == nb::device::cuda::value;
  if (cuda != device || (!cuda && a.device_type() != nb::device::cpu::value))
    throw Error(what + ": expected a tensor in " + (device ? "CUDA device" : "host (CPU)") + " memory, where the cache is");
  if (a.ndim() != 4) throw Error(what + ": expected [batch, heads, tokens, head_dim], got " + std::to_string(a.ndim()) + " dimensions");
  for (size_t i = 0; i < 4; ++i) {
    if (a.shape(i) >= (size_t{1} << 31) || a.stride(i) < 0) throw Error(what + ": shape or strides out of range");
  }
  if (a.stride(3) != 1 && a.shape(3) > 1) throw Error(what + ": the channels of a head must be contiguous");
  return {static_cast<uint16_t*>(a.data()), static_cast<int>(a.shape(0)), static_cast<int>(a.shape(1)),
          static_cast<int>(a.shape(2)), static_cast<int>(a.shape(3)), a.stride(0), a.stride(1), a.stride(2)};
}

BatchRows batch_rows_from(const DeviceArray& a, bool device, const std::string& what) {
  const MutableBatchRows r = mutable_batch_rows_from(a, device, what);
  return {r.data, r.batch, r.heads, r.tokens, r.head_dim, r.batch_stride, r.head_stride, r.token_stride};
}

}  // namespace gaac::python
