// The inner kernels of CPU attention: the scores of one block's tokens and the fold of its value
// rows, for every query head of one KV head, reading either a compressed slot or BF16 rows.
//
// Contract (what makes every path give the same bits): for token t and head g,
//   score = (float)((h0 + h2) + (h1 + h3)) · scale, with lanes[l] (l < 32) summing k[c]·q[c] over the
//   channels c ≡ l (mod 32) in increasing order (each product rounded, then added: no FMA), starting
//   from +0; v[l] = (lanes[l] + lanes[16+l]) + (lanes[8+l] + lanes[24+l]) and h[l] = v[4+l] + v[l];
// and for the fold, for each token t in order, acc = acc · rescale[t] (skipped when rescale is 1,
// which changes no bit), then acc = fma(v[t], weight[t], acc). A NaN result is NaN on every path,
// but its payload and sign are not part of the contract (IEEE 754 leaves them open, and compilers
// swap the operands of a + b).
#pragma once

#include <cstddef>
#include <cstdint>

#include "gaac/tile_codec.hpp"

namespace gaac::attention {

/// Most query heads one BlockTask may carry (one KV head's share of a grouped-query model).
inline constexpr int kMaxQueryHeads = 64;

/// The rows of one tile (one half-head of one block): a compressed slot and the codec that decodes it,
/// or BF16 rows (tile_channels values each) anywhere in memory.
struct TileSource {
  const TileCodec* codec = nullptr;  ///< set: `slot` is compressed
  const uint8_t* slot = nullptr;
  const uint16_t* rows[kTileTokens] = {};  ///< raw rows, for the tokens that exist
};

/// One block's work for the query heads of one KV head.
struct BlockTask {
  const TileSource* halves = nullptr;  ///< `halves` sources: the half-heads in channel order
  int halves_count = 1;
  int tile_channels = 128;
  int first = 0, end = 0;  ///< tokens first .. end-1 of the block
  int heads = 1;           ///< query heads, 1 .. kMaxQueryHeads
};

/// scores[g · 16 + t] for t in [first, end): the contract's score of token t for query g. `q` holds the
/// heads' queries already rounded to BF16, `heads × head_dim` floats (head_dim = halves × channels).
using KeyScoresFn = void (*)(const BlockTask& task, const float* q, float scale, float* scores);
/// acc[g · head_dim + c] folded over tokens [first, end) with rescale[g · 16 + t] and weight[g · 16 + t].
using FoldValuesFn = void (*)(const BlockTask& task, const float* rescale, const float* weight, float* acc);
/// Writes the queries `q` (`heads × head_dim` floats) in the order a compressed key kernel reads them
/// to `out` (as many floats): done once per query, not once per block.
using PrepareQueryFn = void (*)(int heads, int head_dim, const float* q, float* out);

/// One implementation of both kernels for raw and for compressed sources.
struct Kernels {
  KeyScoresFn key_scores_raw;
  FoldValuesFn fold_values_raw;
  /// Reads its queries as prepare_compressed_query leaves them (as given when that is null).
  KeyScoresFn key_scores_compressed;
  FoldValuesFn fold_values_compressed;
  PrepareQueryFn prepare_compressed_query;
  const char* name;
};

/// Plain C++: the compressed kernels rebuild each group of eight values in locals from the slot.
const Kernels& scalar_kernels();
/// AVX2 + FMA (null when this build or CPU has none): raw rows in vector loops, compressed slots
/// rebuilt in registers by the AVX2 decoder's parts (fused_avx2.hpp).
const Kernels* avx2_kernels();
/// AVX-512 (F, BW, VL, VBMI on top of avx2_kernels(); null when this build or CPU has none): the
/// AVX2 kernels for raw rows, fused_avx512.hpp for compressed slots.
const Kernels* avx512_kernels();
/// The fastest available.
const Kernels& best_kernels();

}  // namespace gaac::attention
