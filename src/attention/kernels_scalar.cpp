// Scalar attention kernels (plain C++). Raw rows follow the contract in plain loops; compressed slots are read
// one exponent group (eight values) at a time, each rebuilt in locals and used at once: a token's
// score from the four lanes' groups of its row, a value channel pair's fold from the four groups that
// hold its sixteen tokens. Built with -ffp-contract=off: only the written fused multiply-adds fuse.
#include <cmath>
#include <cstring>
#include <vector>

#include "attention/tile_kernels.hpp"
#include "gaac/bf16.hpp"

namespace gaac::attention {
namespace {

constexpr int kLanes = 32;

/// Reads single exponent groups of a slot: the escapes' start of every group is found once.
class SlotReader {
 public:
  SlotReader(TileShape shape, const uint8_t* slot, TileBases bases) : shape_(shape), slot_(slot), bases_(bases) {
    const uint8_t* tags = slot + shape.tag_offset();
    uint32_t next = 0;
    for (int g = 0; g < shape.groups(); ++g) {
      start_[g] = static_cast<uint16_t>(next);
      next += static_cast<uint32_t>(escape_bytes_for(static_cast<GroupMode>(tags[g / 4] >> (2 * (g % 4)) & 3u)));
    }
  }

  /// The eight BF16 values of group `pair` of `lane`, in group order (quad 2·pair, then 2·pair + 1).
  void group(int lane, int pair, uint16_t out[kGroupSize]) const {
    const int g = group_index(shape_, lane, 2 * pair);
    const auto mode = static_cast<GroupMode>(slot_[shape_.tag_offset() + static_cast<size_t>(g / 4)] >> (2 * (g % 4)) & 3u);
    const uint8_t* planes = slot_ + shape_.escape_offset() + start_[g];
    const int n_planes = escape_bytes_for(mode);
    for (int i = 0; i < kGroupSize; ++i) {
      const int quad = 2 * pair + i / kQuadSize, byte = i % kQuadSize;
      uint32_t d = code(lane, quad, byte);
      for (int k = 0; k < n_planes; ++k) d |= ((planes[k] >> i) & 1u) << (3 + k);
      const int channel = element_slot(shape_, lane, quad, byte).channel;
      const int base = mode == GroupMode::bits3 ? bases_.b3[channel] : mode == GroupMode::bits4 ? bases_.b4[channel] : 0;
      out[i] = bf16_compose(slot_[sign_mantissa_offset(lane, quad, byte)], static_cast<uint8_t>(base + static_cast<int>(d)));
    }
  }

 private:
  uint32_t word(int lane, int w) const {
    uint32_t x;
    std::memcpy(&x, slot_ + shape_.code_offset() + code_word_offset(shape_, lane, w), sizeof x);
    return x;
  }
  uint32_t code(int lane, int quad, int byte) const {
    const CodeBits at = code_bits(shape_, quad);
    uint32_t c = (word(lane, at.low_word) >> (8 * byte + at.low_shift)) & ((1u << at.low_bits) - 1);
    if (at.high_word >= 0) c |= ((word(lane, at.high_word) >> (8 * byte + at.high_shift)) & 1u) << 2;
    return c;
  }

  TileShape shape_;
  const uint8_t* slot_;
  TileBases bases_;
  uint16_t start_[2 * kMaxTileChannels];
};

/// The contract's reduction of 32 lanes.
float reduce_lanes(const float* lanes) {
  float v[8], h[4];
  for (int l = 0; l < 8; ++l) v[l] = (lanes[l] + lanes[16 + l]) + (lanes[8 + l] + lanes[24 + l]);
  for (int l = 0; l < 4; ++l) h[l] = v[4 + l] + v[l];
  return (h[0] + h[2]) + (h[1] + h[3]);
}

void fold_one(float& acc, float v, float rescale, float weight) {
  if (rescale != 1.0f) acc *= rescale;
  acc = std::fma(v, weight, acc);
}

void key_scores_raw(const BlockTask& task, const float* q, float scale, float* scores) {
  const int head_dim = task.halves_count * task.tile_channels;
  for (int t = task.first; t < task.end; ++t) {
    for (int g = 0; g < task.heads; ++g) {
      float lanes[kLanes] = {};
      const float* qg = q + static_cast<size_t>(g) * head_dim;
      for (int half = 0; half < task.halves_count; ++half) {
        const uint16_t* k = task.halves[half].rows[t];
        for (int c = 0; c < task.tile_channels; ++c) {
          const int channel = half * task.tile_channels + c;
          lanes[channel % kLanes] = bf16_to_float(k[c]) * qg[channel] + lanes[channel % kLanes];
        }
      }
      scores[g * kTileTokens + t] = reduce_lanes(lanes) * scale;
    }
  }
}

void fold_values_raw(const BlockTask& task, const float* rescale, const float* weight, float* acc) {
  const int head_dim = task.halves_count * task.tile_channels;
  for (int g = 0; g < task.heads; ++g) {
    float* ag = acc + static_cast<size_t>(g) * head_dim;
    for (int t = task.first; t < task.end; ++t) {
      for (int half = 0; half < task.halves_count; ++half) {
        const uint16_t* v = task.halves[half].rows[t];
        for (int c = 0; c < task.tile_channels; ++c) {
          fold_one(ag[half * task.tile_channels + c], bf16_to_float(v[c]), rescale[g * kTileTokens + t], weight[g * kTileTokens + t]);
        }
      }
    }
  }
}

void key_scores_compressed(const BlockTask& task, const float* q, float scale, float* scores) {
  const int channels = task.tile_channels, head_dim = task.halves_count * channels;
  const TileShape shape{TensorKind::key, channels};
  // Token 8h + r sits in lanes 4r + t; its groups there are h·(C/32) + p, p = 0 .. C/32 − 1, and group
  // p of a lane covers channels of chunk p only, so visiting p in order keeps every lane's sum in
  // channel order.
  const int chunks = channels / kLanes;
  std::vector<float> lane_sums(static_cast<size_t>(kTileTokens) * task.heads * kLanes, 0.0f);
  const auto lanes = [&](int t, int g) { return lane_sums.data() + (static_cast<size_t>(t) * task.heads + g) * kLanes; };
  for (int half = 0; half < task.halves_count; ++half) {
    const TileSource& src = task.halves[half];
    const SlotReader reader(shape, src.slot, src.codec->bases());
    for (int t = task.first; t < task.end; ++t) {
      const int h = t / 8, r = t % 8;
      for (int p = 0; p < chunks; ++p) {
        for (int lt = 0; lt < 4; ++lt) {
          const int lane = 4 * r + lt, pair = h * chunks + p;
          uint16_t values[kGroupSize];
          reader.group(lane, pair, values);
          for (int i = 0; i < kGroupSize; ++i) {
            const int channel = half * channels + element_slot(shape, lane, 2 * pair + i / kQuadSize, i % kQuadSize).channel;
            const float k = bf16_to_float(values[i]);
            for (int g = 0; g < task.heads; ++g) {
              float& lane_sum = lanes(t, g)[channel % kLanes];
              lane_sum = k * q[static_cast<size_t>(g) * head_dim + channel] + lane_sum;
            }
          }
        }
      }
    }
  }
  for (int t = task.first; t < task.end; ++t) {
    for (int g = 0; g < task.heads; ++g) scores[g * kTileTokens + t] = reduce_lanes(lanes(t, g)) * scale;
  }
}

void fold_values_compressed(const BlockTask& task, const float* rescale, const float* weight, float* acc) {
  const int channels = task.tile_channels, head_dim = task.halves_count * channels;
  const TileShape shape{TensorKind::value, channels};
  for (int half = 0; half < task.halves_count; ++half) {
    const TileSource& src = task.halves[half];
    const SlotReader reader(shape, src.slot, src.codec->bases());
    // Group `pair` of lanes 4r + t holds channels 16·pair + r and 16·pair + 8 + r at tokens
    // 2t + {0, 8, 1, 9}: the four lanes t together hold all sixteen tokens of the two channels.
    for (int pair = 0; pair < channels / 16; ++pair) {
      for (int r = 0; r < 8; ++r) {
        float column[2][kTileTokens];
        for (int lt = 0; lt < 4; ++lt) {
          uint16_t values[kGroupSize];
          reader.group(4 * r + lt, pair, values);
          for (int i = 0; i < kGroupSize; ++i) {
            const ElementSlot at = element_slot(shape, 4 * r + lt, 2 * pair + i / kQuadSize, i % kQuadSize);
            column[i / kQuadSize][at.token] = bf16_to_float(values[i]);
          }
        }
        for (int side = 0; side < 2; ++side) {
          const int channel = half * channels + 16 * pair + 8 * side + r;
          for (int g = 0; g < task.heads; ++g) {
            float& a = acc[static_cast<size_t>(g) * head_dim + channel];
            for (int t = task.first; t < task.end; ++t) {
              fold_one(a, column[side][t], rescale[g * kTileTokens + t], weight[g * kTileTokens + t]);
            }
          }
        }
      }
    }
  }
}

/// Each query of the tile on its own: its scores, its online softmax, its fold.
void query_tile(const QueryTileTask& task) {
  const int head_dim = task.halves_count * task.tile_channels;
  float* scores = task.scratch;
  float* rescale = scores + kTileTokens * task.heads;
  float* weight = rescale + kTileTokens * task.heads;
  for (int i = 0; i < task.count; ++i) {
    const TokenRange r = task.ranges[i];
    if (r.end <= r.first) continue;
    const size_t lane = static_cast<size_t>(i) * task.heads;
    BlockTask block{task.k, task.halves_count, task.tile_channels, r.first, r.end, task.heads};
    key_scores_raw(block, task.q + lane * head_dim, task.scale, scores);
    for (int h = 0; h < task.heads; ++h) {
      Partial part{task.max[lane + h], task.sum[lane + h]};
      online_softmax(scores + h * kTileTokens, r.first, r.end, part, rescale + h * kTileTokens, weight + h * kTileTokens);
      task.max[lane + h] = part.max;
      task.sum[lane + h] = part.sum;
    }
    block.halves = task.v;
    fold_values_raw(block, rescale, weight, task.acc + lane * head_dim);
  }
}

}  // namespace

const Kernels& scalar_kernels() {
  static const Kernels kernels{key_scores_raw, fold_values_raw, key_scores_compressed, fold_values_compressed, nullptr, query_tile,
                               "scalar"};
  return kernels;
}

const Kernels& best_kernels() {
  static const Kernels& best = avx512_kernels() != nullptr ? *avx512_kernels()
                               : avx2_kernels() != nullptr ? *avx2_kernels()
                                                           : scalar_kernels();
  return best;
}

}  // namespace gaac::attention
