// Decode attention on the CPU over a paged KV cache, reading compressed tiles in place.
//
// Numerics are those of llama.cpp's CPU flash attention (ggml-cpu, x86 AVX2 build), so an engine
// that computes the rest as llama.cpp does gets llama.cpp's logits: the query rounded to BF16; each
// score a BF16 dot product in 32 float lanes (multiply, then add; lane l sums channels l, l+32, ...
// in order) reduced in a fixed tree, times `scale`; an online softmax over positions in order
// (running maximum M; a score above it rescales the accumulator by e^(M−s) and weighs its value row
// by 1, any other weighs its row by e^(s−M), expf as the C library computes it; S = fma(S, ms, vs));
// each value row folded with a fused multiply-add; the output scaled by 1/S. With `splits` > 1 the
// positions are cut into consecutive ranges whose partial results (M, S, accumulator) are merged in
// order; the result is then not llama.cpp's, but it is the same for every path and cache format.
//
// Every path gives the same bits for the same values: fused (compressed tiles rebuilt in registers
// straight from their slots: a register of 32 or 64 elements at a time with AVX2 or AVX-512, a group
// of eight in scalar code), reference (each compressed tile decoded to BF16 first), and a BF16
// cache holding the same values. NaN results are NaN on every path, with unspecified payloads.
//
// An FP8 cache (gaac_fp8 or fp8) is read as BF16 rows widened from its codes block by block, in each job's
// scratch: code x is the operand fp8_to_float(x), exact in BF16; layer l's scales apply where engines apply
// them, `scale` · k_scale[l] (one float product) multiplying every score and (1/S) · v_scale[l] the output
// (docs/format.md, section 13); the rest is the BF16 arithmetic above. A gaac_fp8 cache and its fp8 twin
// give the same bits on every path, those of a BF16 cache holding the codes' values with those factors. Queries over
// an FP8 cache take no extra rows (the pass's codes are appended first).
#pragma once

#include <span>

#include "gaac/export.h"
#include "gaac/kv_cache.hpp"

namespace gaac {

/// How compressed tiles are read.
enum class AttentionPath : uint8_t {
  fused,      ///< rebuilt in registers from the slot, never written out as a tile
  reference,  ///< decoded to a BF16 tile in scratch memory, then read as a raw tile
};

/// One query token of one sequence, every query head.
struct AttentionQuery {
  SequenceId sequence = 0;
  /// The token's position: it attends first_attended(position, window) .. position.
  int position = 0;
  const float* q = nullptr;  ///< q_heads × head_dim floats
  float* out = nullptr;      ///< q_heads × head_dim floats
  /// Rows after the cached ones, for tokens of a forward pass that are not in the cache yet: positions
  /// length .. length + extra_k.tokens − 1 of the sequence, `[tokens, kv_heads, head_dim]` (tokens may
  /// be 0). Positions at or beyond the cache's length are read from here. BF16 caches only.
  KvView extra_k{};
  KvView extra_v{};
};

/// How to attend.
struct AttentionOptions {
  int q_heads = 0;     ///< a multiple of the cache's KV heads (query head i reads KV head i / (q_heads / kv_heads))
  float scale = 1.0f;  ///< applied to every score
  /// Sliding window in tokens: −1 takes the cache's window for the layer, 0 attends to everything.
  int window = -1;
  AttentionPath path = AttentionPath::fused;
  /// Ranges the positions of each (query, KV head) are cut into, worked on in parallel and merged; 1
  /// keeps one pass in position order (llama.cpp's arithmetic). Ranges are whole blocks.
  int splits = 1;
  ParallelFor parallel;  ///< optional: spreads (query, KV head, range) jobs over threads (the longest first)
};

/// Attends `queries` over layer `layer` of `cache` (the positions each needs must be held). With one
/// split, consecutive queries of one sequence at consecutive positions with the same extra rows (a
/// prefill pass's) are attended together, up to 16 at a time, each block read once for all of them;
/// every query's result is the same bits as when it is attended alone. Throws
/// gaac::Error on a bad argument (unknown sequence, position past the rows given, heads that do not
/// divide, a released position, extra rows for an FP8 cache).
GAAC_API void attend(const KvCache& cache, int layer, std::span<const AttentionQuery> queries, const AttentionOptions& options);

/// Name of a path ("fused", "reference").
GAAC_API const char* to_string(AttentionPath path);

}  // namespace gaac
