// Warp-level helpers shared by the CUDA kernels. Device code only.
#pragma once

#include <cstdint>

namespace gaac::cuda::detail {

/// Exclusive prefix sum of `value` over the lanes of a warp (all 32 lanes take part).
__device__ __forceinline__ uint32_t warp_exclusive_scan(uint32_t value, int lane) {
  uint32_t x = value;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const uint32_t y = __shfl_up_sync(0xFFFFFFFFu, x, d);
    if (lane >= d) x += y;
  }
  return x - value;
}

}  // namespace gaac::cuda::detail
