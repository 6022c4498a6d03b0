// A tiny C interface to DietGPU's float codec (facebookresearch/dietgpu, MIT), for ctypes: bench_codecs.py loads
// the shared library built from this file and DietGPU's own sources (scripts/prepare_codec_peers.sh), so the
// harness needs neither torch extensions nor glog. Only our glue lives here; DietGPU's code is compiled from
// a fetched copy that is never committed.
//
// Every function returns 0 on success; otherwise dietgpu_error() says why (a failed DietGPU CHECK throws,
// see glog_stub/glog/logging.h, and is caught here).
#include <cuda_runtime.h>

#include <cassert>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "dietgpu/float/GpuFloatCodec.h"
#include "dietgpu/utils/StackDeviceMemory.h"

namespace {
thread_local std::string g_error;
constexpr int kProbBits = 10;  // DietGPU's default precision (DietGpu.cpp: kDefaultPrecision)

dietgpu::FloatCodecConfig bf16_config(bool aligned) {
  return dietgpu::FloatCodecConfig(dietgpu::FloatType::kBFloat16, dietgpu::ANSCodecConfig(kProbBits, false),
                                   aligned, false);
}

bool all_aligned(const void* const* ptrs, int n) {
  for (int i = 0; i < n; ++i)
    if (reinterpret_cast<uintptr_t>(ptrs[i]) % 16 != 0) return false;
  return true;
}

template <typename F>
int guarded(F&& f) {
  try {
    f();
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
      g_error = std::string("CUDA error: ") + cudaGetErrorString(e);
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    g_error = e.what();
    return 1;
  } catch (...) {
    g_error = "unknown exception";
    return 1;
  }
}
}  // namespace

extern "C" {

const char* dietgpu_error() { return g_error.c_str(); }

// Temporary device memory for DietGPU: `temp` (device pointer, `temp_bytes`, 16-byte aligned) owned by the caller.
// With enough of it DietGPU never calls cudaMalloc inside compress/decompress.
void* dietgpu_create(void* temp, size_t temp_bytes) {
  void* out = nullptr;
  int rc = guarded([&] {
    int device = 0;
    cudaGetDevice(&device);
    out = new dietgpu::StackDeviceMemory(device, temp, temp_bytes);
  });
  return rc == 0 ? out : nullptr;
}

void dietgpu_destroy(void* h) { delete static_cast<dietgpu::StackDeviceMemory*>(h); }

// Worst-case compressed bytes of `words` BF16 values.
uint32_t dietgpu_max_compressed_bytes(uint32_t words) {
  return dietgpu::getMaxFloatCompressedSize(dietgpu::FloatType::kBFloat16, words);
}

// Bytes of DietGPU temporary memory used so far at most.
size_t dietgpu_max_temp_usage(void* h) {
  return static_cast<dietgpu::StackDeviceMemory*>(h)->getMaxMemoryUsage();
}

// Compresses a batch of `n` BF16 arrays: in[i] (device) of words[i] values into out[i] (device, at least
// dietgpu_max_compressed_bytes(words[i]) bytes); out_bytes (device, n uint32) receives the compressed sizes.
int dietgpu_compress_bf16(void* h, int n, const void** in, const uint32_t* words, void** out, uint32_t* out_bytes,
                          void* stream) {
  return guarded([&] {
    auto& res = *static_cast<dietgpu::StackDeviceMemory*>(h);
    dietgpu::floatCompress(res, bf16_config(all_aligned(in, n)), n, in, words, out, out_bytes,
                           static_cast<cudaStream_t>(stream));
  });
}

// Decompresses a batch of `n` DietGPU float archives in[i] (device) into out[i] (device, capacity[i] BF16 values).
// ok (device, n uint8) and out_words (device, n uint32) receive each member's status and size; either may be NULL.
int dietgpu_decompress_bf16(void* h, int n, const void** in, void** out, const uint32_t* capacity, uint8_t* ok,
                            uint32_t* out_words, void* stream) {
  return guarded([&] {
    auto& res = *static_cast<dietgpu::StackDeviceMemory*>(h);
    auto status = dietgpu::floatDecompress(res, bf16_config(all_aligned(out, n)), n, in, out, capacity, ok,
                                           out_words, static_cast<cudaStream_t>(stream));
    if (status.error != dietgpu::FloatDecompressError::None) {
      std::string msg = "DietGPU decompression error";
      for (auto& [i, s] : status.errorInfo) msg += "; member " + std::to_string(i) + ": " + s;
      throw std::runtime_error(msg);
    }
  });
}

}  // extern "C"
