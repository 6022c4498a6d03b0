// The walks over a block's compressed tiles that the fused kernels of every instruction set share:
// which key segments and value chunks make up a block of one head, in the order the contract of
// tile_kernels.hpp needs. An instruction set (`Isa`) supplies only how a segment or a chunk becomes
// floats and how it is consumed:
//
//   keys:   Isa::LaneStore; Isa::segment_floats<G, kChunk>(slot, exponents, o, q) → floats of key
//           segment 8·(2o + kChunk) + q; Isa::segment_for_heads(floats, task, q, head_dim, index,
//           segments, t, scale, store, scores)
//   values: Isa::ChunkFloats; Isa::chunk_floats<G, kOdd>(slot, exponents, o, floats);
//           Isa::fold_chunk(floats, first, end, rescaled, rescale, weight, acc);
//           Isa::rescaled_tokens(rescale) → bit t set when rescale[t] is not 1
//
// Included by each instruction set's kernel files, whose flags compile it.
#pragma once

#include <algorithm>
#include <cstdint>

#include "attention/fused_tile_avx2.hpp"

namespace gaac::attention::fused {

/// Tokens 8h + q for q in [q0, q1) (token half h): their segments are chunk kChunk = h (64 channels)
/// or chunks 2h, 2h + 1 of each half-head. The loops run over q with h fixed, so the decoder's
/// per-register arithmetic is all shifts and strides.
template <class Isa, class G, bool kPatched, int kChunk, int kHalves>
void scores_of_half(const avx2::OpenTile<G>* const* tiles, const BlockTask& task, const float* q, int h, int q0, int q1,
                    float scale, typename Isa::LaneStore& store, float* scores) {
  constexpr int kSegments = G::kShape.channels / 64;  // per token and half-head
  constexpr int kHeadDim = kHalves * G::kShape.channels;
  // The halves' slots and exponents, made once (the last one twice for a single half).
  const uint8_t* const slots[2] = {tiles[0]->slot(), tiles[kHalves - 1]->slot()};
  const auto exponents0 = tiles[0]->template exponents<kPatched>();
  const auto exponents1 = tiles[kHalves - 1]->template exponents<kPatched>();
  for (int qq = q0; qq < q1; ++qq) {
    const int t = 8 * h + qq;
#pragma GCC unroll 2
    for (int half = 0; half < kHalves; ++half) {
      const auto& exponents = half == 0 ? exponents0 : exponents1;
      const int index = half * kSegments;
      if constexpr (kSegments == 2) {
        Isa::segment_for_heads(Isa::template segment_floats<G, 0>(slots[half], exponents, h, qq), task, q, kHeadDim, index,
                               kHalves * kSegments, t, scale, store, scores);
        Isa::segment_for_heads(Isa::template segment_floats<G, 1>(slots[half], exponents, h, qq), task, q, kHeadDim, index + 1,
                               kHalves * kSegments, t, scale, store, scores);
      } else {
        Isa::segment_for_heads(Isa::template segment_floats<G, kChunk>(slots[half], exponents, 0, qq), task, q, kHeadDim, index,
                               kHalves * kSegments, t, scale, store, scores);
      }
    }
  }
}

template <class Isa, class G, bool kPatched, int kHalves>
void scores_for(const avx2::OpenTile<G>* const* tiles, const BlockTask& task, const float* q, float scale, float* scores) {
  typename Isa::LaneStore store;
  // Token t = 8h + q is lane group q of the chunks of token half h.
  for (int h = task.first / 8; h <= (task.end - 1) / 8; ++h) {
    const int q0 = std::max(task.first - 8 * h, 0), q1 = std::min(task.end - 8 * h, 8);
    if (h == 0) {
      scores_of_half<Isa, G, kPatched, 0, kHalves>(tiles, task, q, 0, q0, q1, scale, store, scores);
    } else {
      scores_of_half<Isa, G, kPatched, 1, kHalves>(tiles, task, q, 1, q0, q1, scale, store, scores);
    }
  }
}

template <class Isa, class G, int kHalves>
void scores_of_tiles(const avx2::OpenTile<G>* const* tiles, const BlockTask& task, const float* q, float scale, float* scores) {
  bool patched = false;
  for (int half = 0; half < kHalves; ++half) patched = patched || tiles[half]->patched();
  if (patched) {
    scores_for<Isa, G, true, kHalves>(tiles, task, q, scale, scores);
  } else {
    scores_for<Isa, G, false, kHalves>(tiles, task, q, scale, scores);
  }
}

template <class Isa, int Channels>
void scores_of_shape(const BlockTask& task, const float* q, float scale, float* scores) {
  using G = avx2::Geometry<TensorKind::key, Channels>;
  const avx2::OpenTile<G> first(*task.halves[0].codec, task.halves[0].slot);
  if (task.halves_count == 1) {
    const avx2::OpenTile<G>* tiles[] = {&first};
    scores_of_tiles<Isa, G, 1>(tiles, task, q, scale, scores);
  } else {
    const avx2::OpenTile<G> second(*task.halves[1].codec, task.halves[1].slot);
    const avx2::OpenTile<G>* tiles[] = {&first, &second};
    scores_of_tiles<Isa, G, 2>(tiles, task, q, scale, scores);
  }
}

/// KeyScoresFn over compressed slots for one instruction set.
template <class Isa>
void key_scores(const BlockTask& task, const float* q, float scale, float* scores) {
  if (task.tile_channels == 64) {
    scores_of_shape<Isa, 64>(task, q, scale, scores);
  } else {
    scores_of_shape<Isa, 128>(task, q, scale, scores);
  }
}

template <class Isa, class G, int kOdd, bool kPatched>
void fold_chunk_for_heads(const avx2::OpenTile<G>& tile, int o, const BlockTask& task, int half, const uint32_t* rescaled,
                          const float* rescale, const float* weight, float* acc) {
  typename Isa::ChunkFloats v;
  Isa::template chunk_floats<G, kOdd>(tile.slot(), tile.template exponents<kPatched>(), o, v);
  const int head_dim = task.halves_count * G::kShape.channels, channel = half * G::kShape.channels + 32 * (2 * o + kOdd);
  for (int g = 0; g < task.heads; ++g) {
    Isa::fold_chunk(v, task.first, task.end, rescaled[g], rescale + g * kTileTokens, weight + g * kTileTokens,
                    acc + static_cast<size_t>(g) * head_dim + channel);
  }
}

template <class Isa, class G, bool kPatched>
void fold_half(const avx2::OpenTile<G>& tile, const BlockTask& task, int half, const uint32_t* rescaled, const float* rescale,
               const float* weight, float* acc) {
  for (int o = 0; o < G::kOctets; ++o) {
    fold_chunk_for_heads<Isa, G, 0, kPatched>(tile, o, task, half, rescaled, rescale, weight, acc);
    fold_chunk_for_heads<Isa, G, 1, kPatched>(tile, o, task, half, rescaled, rescale, weight, acc);
  }
}

template <class Isa, int Channels>
void fold_of_shape(const BlockTask& task, const float* rescale, const float* weight, float* acc) {
  using G = avx2::Geometry<TensorKind::value, Channels>;
  uint32_t rescaled[kMaxQueryHeads];
  for (int g = 0; g < task.heads; ++g) rescaled[g] = Isa::rescaled_tokens(rescale + g * kTileTokens);
  for (int half = 0; half < task.halves_count; ++half) {
    const avx2::OpenTile<G> tile(*task.halves[half].codec, task.halves[half].slot);
    if (tile.patched()) {
      fold_half<Isa, G, true>(tile, task, half, rescaled, rescale, weight, acc);
    } else {
      fold_half<Isa, G, false>(tile, task, half, rescaled, rescale, weight, acc);
    }
  }
}

/// FoldValuesFn over compressed slots for one instruction set.
template <class Isa>
void fold_values(const BlockTask& task, const float* rescale, const float* weight, float* acc) {
  if (task.first >= task.end) return;
  if (task.tile_channels == 64) {
    fold_of_shape<Isa, 64>(task, rescale, weight, acc);
  } else {
    fold_of_shape<Isa, 128>(task, rescale, weight, acc);
  }
}

}  // namespace gaac::attention::fused
