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

#include "attention/online_softmax.hpp"
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

/// Tokens first .. end-1 of a block (none when end <= first).
struct TokenRange {
  int first = 0, end = 0;
};

/// One block of positions for a tile of queries of one KV head (consecutive tokens of a sequence,
/// as a prefill has them). Lane j is query j / heads, query head j % heads. Each query's result is
/// what it gets alone from key_scores_raw, online_softmax and fold_values_raw over its positions in
/// order, bit for bit.
struct QueryTileTask {
  const TileSource* k = nullptr;  ///< `halves_count` raw sources each (rows of every token first .. end-1)
  const TileSource* v = nullptr;
  int halves_count = 1;
  int tile_channels = 128;
  int first = 0, end = 0;  ///< the block's tokens any query attends
  int heads = 1;           ///< query heads per query, 1 .. kMaxQueryHeads
  float scale = 1.0f;
  int count = 0;                       ///< queries, at most kMaxTileQueries
  const TokenRange* ranges = nullptr;  ///< per query: the tokens it attends, within first .. end-1
  const float* q = nullptr;            ///< per lane: head_dim floats, already rounded to BF16
  float* acc = nullptr;                ///< per lane: head_dim accumulators
  float* max = nullptr;                ///< per lane: the online softmax's running maximum ...
  float* sum = nullptr;                ///< ... and sum
  float* scratch = nullptr;            ///< query_tile_scratch_floats(head_dim, count · heads) floats
};

/// Most queries in one QueryTileTask.
inline constexpr int kMaxTileQueries = 16;

/// Floats of scratch a QueryTileTask of `lanes` lanes needs: K and V rows widened to float, and
/// per lane (rounded up to a multiple of eight) scores, factors and softmax states.
constexpr size_t query_tile_scratch_floats(int head_dim, int lanes) {
  return 2 * static_cast<size_t>(kTileTokens) * head_dim + (3 * static_cast<size_t>(kTileTokens) + 2) * (static_cast<size_t>(lanes) + 8);
}

/// Runs one block of a query tile.
using QueryTileFn = void (*)(const QueryTileTask& task);

/// One implementation of both kernels for raw and for compressed sources.
struct Kernels {
  KeyScoresFn key_scores_raw;
  FoldValuesFn fold_values_raw;
  /// Reads its queries as prepare_compressed_query leaves them (as given when that is null).
  KeyScoresFn key_scores_compressed;
  FoldValuesFn fold_values_compressed;
  PrepareQueryFn prepare_compressed_query;
  QueryTileFn query_tile;
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
