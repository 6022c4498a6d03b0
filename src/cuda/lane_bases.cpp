#include "cuda/lane_bases.hpp"

#include "cuda/lane_decode.cuh"

namespace gaac::cuda::detail {
namespace {

template <int C>
void fill_head(const PagedGeometry& g, const uint8_t* bases, int layer, int head, uint32_t* words) {
  constexpr int kSteps = C / 16, kQuads = C / 8, kPerHalf = 2 * (kSteps + kQuads);
  const bool fp8 = is_fp8(g.element_format);
  for (int half = 0; half < g.halves(); ++half) {
    for (int w = 0; w < kPerHalf; ++w) {
      const bool key = w < 2 * kSteps;
      const int k = key ? w % kSteps : (w - 2 * kSteps) % kQuads;
      const bool delta = key ? w >= kSteps : w - 2 * kSteps >= kQuads;
      const TensorKind kind = key ? TensorKind::key : TensorKind::value;
      const uint8_t* b3 = bases + g.bases_index(layer, kind, 0, head) + half * C;
      const uint8_t* b4 = bases + g.bases_index(layer, kind, 1, head) + half * C;
      const int section = w - k;  // word offset of the section inside the half
      for (int l = 0; l < 32; ++l) {
        const uint32_t w3 = key ? lane::base_word<C, true>(b3, l, k) : lane::base_word<C, false>(b3, l, k);
        const uint32_t w4 = key ? lane::base_word<C, true>(b4, l, k) : lane::base_word<C, false>(b4, l, k);
        words[(half * kPerHalf + section) * 32 + ((k / 4) * 32 + l) * 4 + k % 4] = !delta ? w3 : fp8 ? w4 : w4 - w3;
      }
    }
  }
}

}  // namespace

void fill_lane_bases(const PagedGeometry& geometry, const uint8_t* bases, uint32_t* out) {
  for (int layer = 0; layer < geometry.layers; ++layer)
    for (int head = 0; head < geometry.kv_heads; ++head) {
      uint32_t* words = out + lane_bases_index(geometry, layer, head);
      if (geometry.tile_channels() == 64) fill_head<64>(geometry, bases, layer, head, words);
      else fill_head<128>(geometry, bases, layer, head, words);
    }
}

}  // namespace gaac::cuda::detail
