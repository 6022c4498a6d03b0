// Warp-level helpers shared by the CUDA kernels. Device code only.
#pragma once

#include <cstdint>

namespace gaac::cuda::detail {

/// Exclusive prefix sum of `value` over the lanes of a warp (all 32 lanes take part).
__device__ __forceinline__ uint32_t warp_exclusive_scan(uint32_t value, int lane) {
  (void)lane;
  uint32_t x = value;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    // shfl.up's predicate says whether lane - d exists: one shuffle and one predicated add per step.
    asm volatile(
        "{\n .reg .pred valid;\n .reg .b32 y;\n shfl.sync.up.b32 y|valid, %0, %1, 0, 0xffffffff;\n @valid add.u32 %0, %0, y;\n}\n"
        : "+r"(x)
        : "r"(d));
  }
  return x - value;
}

}  // namespace gaac::cuda::detail
