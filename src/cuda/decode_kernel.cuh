// The split-context decode-attention kernel over a paged cache (docs/format.md, section 13), in forms
// that differ only in how a tile becomes operand registers:
//   * TileSource::gaac — compressed slots are rebuilt in registers (lane_decode.cuh), raw tiles read
//     from global memory;
//   * TileSource::bf16 — its twin over a BF16 cache: tiles read from shared memory with ldmatrix;
//   * TileSource::gaac_e4m3 / gaac_e5m2 — GAAC-FP8 slots rebuilt in registers (lane_fp8.cuh), raw FP8
//     tiles read from global memory, every code widened to its exact BF16 value;
//   * TileSource::e4m3 / e5m2 — their twin over a plain FP8 cache: tiles read from shared memory and
//     widened the same way. Its value tiles come through ldmatrix.trans, which hands a lane channels
//     2g and 2g+1 of a 16-channel block where the slots' order has g and g+8: the twin's output rows
//     are those channels (each output element is the same sum of the same products either way).
// Everything else — the pipeline, the products, the online softmax, the merges — is the same code,
// so on the same values a cache and its twin give the same bits.
//
// Work split: CTA (split, KV head, sequence) takes up to blocks_per_split consecutive attended blocks of one
// sequence; its warps take every NW-th block, each streaming its blocks through its own ring of shared-memory
// stages filled by the copy engine (cp.async.bulk, completion on an mbarrier). A warp works on at most one K
// tile and one V tile of a block; each tile buffer has its own mbarrier and is refilled as soon as its tile
// is used (a key tile after the scores, before the softmax and the values), so a key tile's copy starts about
// half a block earlier than a stage released whole would allow. Heads of 256 channels (two tiles) are served
// by pairs of warps, one per 128-channel half, which take every (NW/2)-th block together and add their halves
// of the scores through shared memory (one mbarrier phase a block) before the softmax, which both then run
// alike. 9–16 query heads of one tile are served by pairs that split K and V: the key warp computes the
// scores and hands them over the same way, the value warp runs the softmax and the products with V, so
// neither holds both the queries and the outputs of 16 heads. Per block, Sᵀ = K·Qᵀ with the key tile as the
// m16n8k16 A operand (16 tokens) and the KV head's query heads as the columns of B (8 per column block: no
// zero rows), an online softmax, and Oᵀ += Vᵀ·Pᵀ with the value tile as A operand and Pᵀ, transposed in
// registers (movmatrix), as B. The warps' (pairs') states meet in shared memory, the splits' in global
// memory, merged by the last CTA of each (sequence, KV head).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/decode_params.hpp"
#include "cuda/lane_bases.hpp"
#include "cuda/lane_decode.cuh"
#include "cuda/lane_fp8.cuh"
#include "cuda/ptx.cuh"
#include "cuda/warp.cuh"

namespace gaac::cuda::detail {

/// Fragments of one key tile (B operand of S = Q·Kᵀ): [token half h][channel step s][b0, b1].
template <int C>
using KeyFragments = uint32_t[2][C / 16][2];
/// Fragments of one value tile (A operand of Oᵀ = Vᵀ·Pᵀ): [16-channel block][a0..a3].
template <int C>
using ValueFragments = uint32_t[C / 16][4];

/// The lane's tag field of a slot (as load_lane_slot reads it).
template <int C>
__device__ __forceinline__ uint32_t lane_tags(const uint8_t* slot, int lane) {
  using S = lane::SlotShape<C>;
  if constexpr (C == 128) return *reinterpret_cast<const uint16_t*>(slot + S::kTagOffset + 2 * lane);
  else return slot[S::kTagOffset + lane];
}

/// Escape bytes lane `lane` owns in the compressed slot at `slot` of source Src.
template <int C, TileSource Src>
__device__ __forceinline__ uint32_t lane_escape_bytes(const uint8_t* slot, int lane) {
  if constexpr (Src == TileSource::gaac) {
    return lane::escape_bytes_of_lane(lane_tags<C>(slot, lane));
  } else {
    constexpr ElementFormat F = element_format(Src);
    return lane::fp8_escape_bytes_of_lane<C, F>(lane::fp8_lane_tags<C, F>(slot, lane));
  }
}

/// Where each lane's escapes start in each of a block's tiles: one warp scan for every two tiles (two
/// 16-bit prefix sums in one word; a lane's escapes are at most 40 bytes, a tile's at most 1,280).
/// Tiles that are not compressed count zero.
template <int C, TileSource Src, int kTiles>
__device__ __forceinline__ void escape_offsets(const uint8_t* stage, uint32_t tile_stride, const uint32_t (&ent)[kTiles],
                                               int lane, uint32_t (&offset)[kTiles]) {
  uint32_t count[kTiles];
#pragma unroll
  for (int j = 0; j < kTiles; ++j)
    count[j] = entry_class(ent[j]) == TileClass::compressed ? lane_escape_bytes<C, Src>(stage + j * tile_stride, lane) : 0u;
#pragma unroll
  for (int j = 0; j < kTiles; j += 2) {
    const uint32_t both = warp_exclusive_scan(count[j] | count[j + 1] << 16, lane);
    offset[j] = both & 0xFFFFu;
    offset[j + 1] = both >> 16;
  }
}

/// The order in which decode_groups rebuilds a tile's groups: keys interleave the token halves
/// (group i, then group kSteps/2 + i: the two halves of channel steps 2i and 2i+1, which one product
/// takes together), values go in order (group p is A block p).
template <int C, bool Key>
__device__ __forceinline__ constexpr int group_in_order(int n) {
  constexpr int kHalf = lane::SlotShape<C>::kSteps / 2;
  return Key ? (n % 2 == 0 ? n / 2 : kHalf + n / 2) : n;
}

/// Rebuilds a slot's groups in group_in_order, passing each to `use(group, r0, r1)` as two quads of
/// bf16x2 registers (quad 2G + q: r0[q] its elements 0 and 2, r1[q] 1 and 3), on escape path `Path`.
template <int C, bool Key, lane::EscapePath Path, class Use>
__device__ __forceinline__ void decode_groups(const lane::LaneSlot<C>& s, const uint8_t* escapes, uint32_t offset,
                                              const uint4* base3, const uint4* delta, int lane, const Use& use) {
  const auto base3_at = [&](int w) {
    return reinterpret_cast<const uint32_t*>(base3)[((w / 4) * 32 + lane) * 4 + w % 4];
  };
  const lane::LaneEscapes e = lane::lane_escapes<C, Key>(s.tags, escapes, offset, base3_at);
  [&]<int... N>(std::integer_sequence<int, N...>) {
    (
        [&] {
          constexpr int G = group_in_order<C, Key>(N);
          constexpr int w = lane::base_word_of_quad<C, Key>(2 * G);  // even: both words in one 16-byte chunk
          const uint4 x = base3[(w / 4) * 32 + lane], y = delta[(w / 4) * 32 + lane];
          const uint32_t b3[2] = {w % 4 == 0 ? x.x : x.z, w % 4 == 0 ? x.y : x.w};
          const uint32_t dl[2] = {w % 4 == 0 ? y.x : y.z, w % 4 == 0 ? y.y : y.w};
          uint32_t exponents[2], r0[2], r1[2];
          lane::group_exponents<C, G, Path>(s, e, escapes, offset, b3, dl, exponents);
#pragma unroll
          for (int q = 0; q < 2; ++q) lane::compose(s.sm[2 * G + q], exponents[q], r0[q], r1[q]);
          use(std::integral_constant<int, G>{}, r0, r1);
        }(),
        ...);
  }(std::make_integer_sequence<int, lane::SlotShape<C>::kGroups>{});
}

/// Rebuilds a compressed tile in registers group by group (few live registers), given the lane's
/// escape offset; see decode_groups for `use`. `base3`/`delta` point at the lane-interleaved base
/// words of this (kind, half) in shared memory. Only a tile in which some lane has groups the
/// branch-free path cannot rebuild (rare) takes the wide path; the hot loop stays one compact path.
template <int C, bool Key, class Use>
__device__ __forceinline__ void decode_slot(const uint8_t* slot, int lane, uint32_t offset, const uint4* base3,
                                            const uint4* delta, const Use& use) {
  using S = lane::SlotShape<C>;
  using lane::EscapePath;
  lane::LaneSlot<C> s;
  lane::load_lane_slot<C>(slot, lane, s);
  const uint8_t* escapes = slot + S::kEscapeOffset;
  if (__any_sync(0xFFFFFFFFu, lane::lane_needs_fixing<C>(s.tags)))
    decode_groups<C, Key, EscapePath::wide>(s, escapes, offset, base3, delta, lane, use);
  else
    decode_groups<C, Key, EscapePath::branch_free>(s, escapes, offset, base3, delta, lane, use);
}

/// The two bf16x2 registers of an FP8 quad: by bit placement, or through `table` in a tile that holds
/// a NaN or infinity code (Exact).
template <ElementFormat F, bool Exact>
__device__ __forceinline__ void widen(lane::Fp8Quad q, const uint16_t* table, uint32_t& r0, uint32_t& r1) {
  if constexpr (Exact) lane::widen_exact<F>(q, table, r0, r1);
  else lane::widen_fast<F>(q, r0, r1);
}

/// decode_slot for a GAAC-FP8 slot: its quads rebuilt (lane_fp8.cuh) and widened (through `table`
/// when Exact), passed to `use` group by group as decode_slot does. `base2`/`base3` point at the
/// lane-interleaved b2 and b3 words of this (kind, half) in shared memory, `spread` at the spread table.
template <int C, ElementFormat F, bool Key, bool Exact, class Use>
__device__ __forceinline__ void decode_fp8_slot(const uint8_t* slot, int lane, uint32_t offset, const uint4* base2,
                                                const uint4* base3, const uint32_t* spread, const uint16_t* table,
                                                const Use& use) {
  const auto word = [&](const uint4* words, int w) {  // a 16-byte load the quads of a group share
    const uint4 x = words[(w / 4) * 32 + lane];
    return w % 4 == 0 ? x.x : w % 4 == 1 ? x.y : w % 4 == 2 ? x.z : x.w;
  };
  lane::fp8_decode_groups<C, F, Key>(
      slot, lane, offset, [&](int w) { return word(base2, w); }, [&](int w) { return word(base3, w); }, spread,
      [&](auto group, const lane::Fp8Quad (&quads)[2]) {
        uint32_t r0[2], r1[2];
#pragma unroll
        for (int q = 0; q < 2; ++q) widen<F, Exact>(quads[q], table, r0[q], r1[q]);
        use(group, r0, r1);
      });
}

/// True when the tile of `entry` (compressed or raw) holds a NaN or infinity code (FP8 caches).
__device__ __forceinline__ bool special_tile(const DeviceCacheView& cache, uint32_t entry) {
  const uint32_t unit = entry_unit(entry);
  return (__ldg(cache.special + unit / 32) >> (unit % 32)) & 1u;
}

/// Key fragments from the rebuilt quads: quad h·(C/16) + s is (token half h, channel step s).
template <int C>
__device__ __forceinline__ void key_from_quads(const uint32_t (&r0)[C / 8], const uint32_t (&r1)[C / 8],
                                               KeyFragments<C>& kf) {
#pragma unroll
  for (int q = 0; q < C / 8; ++q) {
    kf[q / (C / 16)][q % (C / 16)][0] = r0[q];
    kf[q / (C / 16)][q % (C / 16)][1] = r1[q];
  }
}

/// Value fragments from the rebuilt quads: quads 2p and 2p+1 are rows g and g+8 of A block p.
template <int C>
__device__ __forceinline__ void value_from_quads(const uint32_t (&r0)[C / 8], const uint32_t (&r1)[C / 8],
                                                 ValueFragments<C>& vf) {
#pragma unroll
  for (int q = 0; q < C / 8; ++q) {
    vf[q / 2][q % 2] = r0[q];
    vf[q / 2][2 + q % 2] = r1[q];
  }
}

/// Key fragments of a BF16 tile staged in shared memory (rows of bf16_row_stride(C) bytes).
template <int C>
__device__ __forceinline__ void key_from_bf16_tile(const uint8_t* tile, int lane, KeyFragments<C>& kf) {
  const int m = lane / 8, r = lane % 8;
  const uint8_t* row = tile + (8 * (m / 2) + r) * bf16_row_stride(C) + (m % 2) * 16;
#pragma unroll
  for (int s = 0; s < C / 16; ++s) {
    uint32_t x[4];
    ptx::ldmatrix_x4(x, row + 32 * s);
    kf[0][s][0] = x[0], kf[0][s][1] = x[1], kf[1][s][0] = x[2], kf[1][s][1] = x[3];
  }
}

/// Value fragments of a BF16 tile staged in shared memory.
template <int C>
__device__ __forceinline__ void value_from_bf16_tile(const uint8_t* tile, int lane, ValueFragments<C>& vf) {
  const int m = lane / 8, r = lane % 8;
  const uint8_t* row = tile + (8 * (m / 2) + r) * bf16_row_stride(C) + (m % 2) * 16;
#pragma unroll
  for (int p = 0; p < C / 16; ++p) ptx::ldmatrix_x4_trans(vf[p], row + 32 * p);
}

/// Rows 0..7 and 8..15 of a raw tile in global memory: one unit, or two (the second's index stored
/// in the first at 16·C) in a cache whose units are smaller than a raw tile.
struct RawRows {
  const uint8_t* low;
  const uint8_t* high;
};

__device__ __forceinline__ RawRows raw_rows(const DecodeArgs& a, uint32_t entry) {
  const uint8_t* first = a.cache.units + a.cache.geometry.unit_offset(entry_unit(entry));
  const size_t half = a.cache.geometry.raw_half_bytes();
  if (!a.cache.geometry.raw_split()) return {first, first + half};
  const uint32_t second = *reinterpret_cast<const uint32_t*>(first + half);
  return {first, a.cache.units + a.cache.geometry.unit_offset(second)};
}

/// Key fragments of a raw tile read from global memory (the rare path of the GAAC kernel).
template <int C>
__device__ __forceinline__ void key_from_raw(const RawRows& rows, int lane, KeyFragments<C>& kf) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t* row = reinterpret_cast<const uint32_t*>((h ? rows.high : rows.low) + g * 2 * C);
#pragma unroll
    for (int s = 0; s < C / 16; ++s) {
      kf[h][s][0] = row[8 * s + t];
      kf[h][s][1] = row[8 * s + 4 + t];
    }
  }
}

/// Value fragments of a raw tile read from global memory.
template <int C>
__device__ __forceinline__ void value_from_raw(const RawRows& rows, int lane, ValueFragments<C>& vf) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int p = 0; p < C / 16; ++p) {
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int channel = 8 * (2 * p + m % 2) + g;
      const uint16_t* lo = reinterpret_cast<const uint16_t*>((m / 2 ? rows.high : rows.low) + (2 * t) * 2 * C);
      const uint16_t* hi = reinterpret_cast<const uint16_t*>((m / 2 ? rows.high : rows.low) + (2 * t + 1) * 2 * C);
      vf[p][m] = static_cast<uint32_t>(lo[channel]) | static_cast<uint32_t>(hi[channel]) << 16;
    }
  }
}

/// Key fragments of an FP8 tile whose rows 0..7 start at `low` and 8..15 at `high`, `stride` bytes
/// apart: a lane's codes of channels 16s + 2t, +1 and 16s + 2t + 8, +9 (two 2-byte loads) make the
/// quad of the slots' order, widened.
template <int C, ElementFormat F, bool Exact>
__device__ __forceinline__ void key_from_fp8_rows(const uint8_t* low, const uint8_t* high, uint32_t stride, int lane,
                                                  const uint16_t* table, KeyFragments<C>& kf) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint8_t* row = (h ? high : low) + g * stride + 2 * t;
#pragma unroll
    for (int s = 0; s < C / 16; ++s) {
      const uint32_t first = *reinterpret_cast<const uint16_t*>(row + 16 * s);
      const uint32_t second = *reinterpret_cast<const uint16_t*>(row + 16 * s + 8);
      widen<F, Exact>(lane::fp8_quad<F>(lane::prmt(first, second, 0x5140u)), table, kf[h][s][0], kf[h][s][1]);
    }
  }
}

/// Value fragments of a plain FP8 tile staged in shared memory (rows of fp8_row_stride(C) bytes), with
/// ldmatrix.trans: a lane receives tokens 2t, 2t+1 of channels 2g, 2g+1 of a 16-channel block, which
/// become A rows g (channel 2g) and g + 8 (channel 2g + 1): the twin's permuted output rows.
template <int C, ElementFormat F, bool Exact>
__device__ __forceinline__ void value_from_fp8_tile(const uint8_t* tile, int lane, const uint16_t* table,
                                                    ValueFragments<C>& vf) {
  const int m = lane / 8, r = lane % 8;
  const uint8_t* row = tile + (8 * (m % 2) + r) * fp8_row_stride(C) + 16 * (m / 2);
#pragma unroll
  for (int pair = 0; pair < C / 32; ++pair) {
    uint32_t x[4];
    ptx::ldmatrix_x4_trans(x, row + 32 * pair);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      uint32_t* a = vf[2 * pair + k / 2] + 2 * (k % 2);  // tokens 0..7: a0, a1; tokens 8..15: a2, a3
      widen<F, Exact>(lane::fp8_quad<F>(x[k]), table, a[0], a[1]);
    }
  }
}

/// Value fragments of a raw FP8 tile in global memory (the rare path of the GAAC-FP8 kernel), in the
/// slots' order: quad c holds channel 8c + g, tokens 2t, 2t+8, 2t+1, 2t+9.
template <int C, ElementFormat F, bool Exact>
__device__ __forceinline__ void value_from_fp8_raw(const RawRows& rows, int lane, const uint16_t* table,
                                                   ValueFragments<C>& vf) {
  const int g = lane / 4, t = lane % 4;
  uint32_t r0[C / 8], r1[C / 8];
#pragma unroll
  for (int c = 0; c < C / 8; ++c) {
    const int channel = 8 * c + g;
    const uint32_t codes = static_cast<uint32_t>(rows.low[2 * t * C + channel]) |
                           static_cast<uint32_t>(rows.high[2 * t * C + channel]) << 8 |
                           static_cast<uint32_t>(rows.low[(2 * t + 1) * C + channel]) << 16 |
                           static_cast<uint32_t>(rows.high[(2 * t + 1) * C + channel]) << 24;
    widen<F, Exact>(lane::fp8_quad<F>(codes), table, r0[c], r1[c]);
  }
  value_from_quads<C>(r0, r1, vf);
}

/// Folds fragments into a word the compiler cannot drop (variants that skip the products).
template <int N>
__device__ __forceinline__ uint32_t fold(const uint32_t* x) {
  uint32_t acc = 0;
#pragma unroll
  for (int i = 0; i < N; ++i) acc ^= x[i];
  return acc;
}

/// Shared-memory base words of (half, key/value, b3/delta).
template <int C>
__device__ __forceinline__ const uint4* base_words(const uint8_t* smem_bases, int half, bool key, bool delta) {
  constexpr int kSteps = C / 16, kQuads = C / 8;
  const int per_half = 2 * (kSteps + kQuads);
  const int section = key ? (delta ? kSteps : 0) : (delta ? 2 * kSteps + kQuads : 2 * kSteps);
  return reinterpret_cast<const uint4*>(smem_bases) + (half * per_half + section) * 8;
}

/// Publishes this CTA's writes and counts it in at `counter`; true (for every thread) in the CTA that
/// arrives `expected`-th.
__device__ __forceinline__ bool last_to_arrive(uint32_t* counter, int expected, int* flag, int tid) {
  __threadfence();
  __syncthreads();
  if (tid == 0) *flag = atomicAdd(counter, 1u) == static_cast<uint32_t>(expected - 1);
  __syncthreads();
  const bool last = *flag != 0;
  if (last) __threadfence();
  return last;
}

/// Merges `count` consecutive partial results (running max m, sum l, unnormalised O of `heads` heads ×
/// kD channels; consecutive partials `stride` heads apart), starting at head `first` of `po`/`pml`, in
/// index order. Final: writes O · ((1 / L) · out_scale) as bf16 to `out`; otherwise writes the merged (M, L, O) to
/// `dst_o`/`dst_ml` (the same stride). `scratch`: shared memory for H × 64 weights and H × 2 floats;
/// heads ≤ H, count ≤ 64.
template <int NW, int H, int kD, bool Final>
__device__ void merge_partials(const float* po, const float* pml, size_t first, int count, int heads, int stride,
                               uint8_t* scratch, uint16_t* out, float* dst_o, float* dst_ml, float out_scale, int tid) {
  const int warp = tid / 32, lane = tid % 32;
  float* weight = reinterpret_cast<float*>(scratch);  // [head][64]
  float* ml = weight + H * 64;                        // [head][M, L]
  for (int head = warp; head < heads; head += NW) {
    float mx = -INFINITY;
    for (int i = lane; i < count; i += 32) mx = fmaxf(mx, __ldcg(&pml[2 * (first + static_cast<size_t>(i) * stride + head)]));
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, d));
    float l = 0.0f;
    for (int i = lane; i < count; i += 32) {
      const size_t at = 2 * (first + static_cast<size_t>(i) * stride + head);
      const float f = mx == -INFINITY ? 0.0f : ptx::exp2_approx(__ldcg(&pml[at]) - mx);
      weight[head * 64 + i] = f;
      l += __ldcg(&pml[at + 1]) * f;
    }
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) l += __shfl_xor_sync(0xFFFFFFFFu, l, d);
    __syncwarp();
    if (Final) {
      const float inv = (l > 0.0f ? 1.0f / l : 0.0f) * out_scale;
      for (int i = lane; i < count; i += 32) weight[head * 64 + i] *= inv;
    } else if (lane == 0) {
      ml[2 * head] = mx, ml[2 * head + 1] = l;
    }
  }
  __syncthreads();
  for (int idx = tid; idx < heads * kD; idx += NW * 32) {
    const int head = idx / kD;
    const float* src = po + first * kD + idx;
    const float* w = weight + head * 64;
    float acc0 = 0.0f, acc1 = 0.0f, acc2 = 0.0f, acc3 = 0.0f;
    int i = 0;
    for (; i + 4 <= count; i += 4) {
      acc0 += __ldcg(src + static_cast<size_t>(i) * stride * kD) * w[i];
      acc1 += __ldcg(src + static_cast<size_t>(i + 1) * stride * kD) * w[i + 1];
      acc2 += __ldcg(src + static_cast<size_t>(i + 2) * stride * kD) * w[i + 2];
      acc3 += __ldcg(src + static_cast<size_t>(i + 3) * stride * kD) * w[i + 3];
    }
    for (; i < count; ++i) acc0 += __ldcg(src + static_cast<size_t>(i) * stride * kD) * w[i];
    const float acc = (acc0 + acc1) + (acc2 + acc3);
    if (Final) {
      out[idx] = static_cast<uint16_t>(ptx::pack_bf16(acc, 0.0f) & 0xFFFFu);
    } else {
      dst_o[idx] = acc;
      if (idx % kD == 0) dst_ml[2 * head] = ml[2 * head], dst_ml[2 * head + 1] = ml[2 * head + 1];
    }
  }
}

/// How far (log2 units) a block's maximum score may pass a head's reference maximum before the
/// reference moves and the accumulators are rescaled: probabilities stay below 2^8, far inside the
/// range of fp32 sums and of the bf16 probabilities P·V multiplies.
inline constexpr float kRescaleSlack = 8.0f;

/// What a warp does with its blocks: all of the work, or, in a pair that splits K and V, the key part (the
/// scores, handed over) or the value part (softmax and outputs).
enum class Part { all, key, value };

/// CTAs per SM the compiler is asked to make room for (registers ≤ 65536 / (CTAs · threads)): for the
/// GAAC kernel at head_dim 128 with two stages, 16 warps per SM (128 registers a thread) as the shared
/// memory allows, 8 warps with 16 query heads per KV head (their accumulators need more); else one
/// (a CTA of 16 warps has 128 registers a thread in any case).
constexpr int min_ctas_per_sm(int channels, int halves, int heads, TileSource source, int warps, int stages) {
  const int warps_per_sm = heads == 8 ? 16 : 8;
  return halves == 1 && stages == 2 && channels == 128 && source == TileSource::gaac && warps < warps_per_sm
             ? warps_per_sm / warps
             : 1;
}

/// The decode-attention kernel; see the top of this file. C: tile channels, P: tiles per head, H:
/// query heads per KV head it has room for (8 or 16: one or two n8 column blocks of the products), NW
/// warps, STAGES stages per warp.
template <int C, int P, int H, TileSource Src, Work W, int NW, int STAGES>
__global__ void __launch_bounds__(NW * 32, min_ctas_per_sm(C, P, H, Src, NW, STAGES))
    decode_attention_kernel(const DecodeArgs a) {
  static_assert(H == 8 || H == 16, "8 or 16 query heads per KV head");
  constexpr ElementFormat F = element_format(Src);
  // A plain FP8 twin: its tiles staged in shared memory, its value tiles giving A rows g and g + 8
  // channels 2g and 2g + 1 of a block (see the top).
  constexpr bool kPlainFp8 = is_fp8(Src) && !is_compressed(Src);
  constexpr int kSteps = C / 16;  // k16 steps of Q·Kᵀ per tile, m16 blocks of Vᵀ·Pᵀ per tile
  constexpr int kBlocks = H / 8;  // n8 column blocks of query heads
  constexpr int kD = C * P;
  constexpr int kTiles = 2 * P;
  constexpr bool kMath = W == Work::full || W == Work::no_decode;
  extern __shared__ __align__(128) uint8_t smem[];

  const int seq = static_cast<int>(blockIdx.z), split = static_cast<int>(blockIdx.x);
  const int kvh = static_cast<int>(blockIdx.y) / a.head_slices;                // the KV head
  const int head0 = static_cast<int>(blockIdx.y) % a.head_slices * H;          // its first query head here
  const int heads = min(H, a.group - head0);                                   // query heads this CTA serves
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  // Launched as a programmatic dependent (DecodePlan::run): this CTA may be resident while the grid before it
  // drains, so its launch overlaps that grid's tail; everything it reads may come from that grid, so it
  // waits here first. The grid after it may then start its own CTAs, which wait the same way.
  ptx::wait_for_previous_grid();
  ptx::allow_next_grid();

  const int len = a.batch.lengths[seq];
  const int row0 = a.batch.indptr[seq];
  const int first = len > 0 ? first_attended(len - 1, a.window) : 0;
  const int first_block = first / kTileTokens;
  const int end_block = min(a.batch.indptr[seq + 1] - row0, (len + kTileTokens - 1) / kTileTokens);
  const int attended = max(0, end_block - first_block);
  const int splits = max(1, (attended + a.blocks_per_split - 1) / a.blocks_per_split);
  if (split >= splits) return;
  const int cta_first = first_block + split * a.blocks_per_split;
  const int cta_blocks = max(0, min(cta_first + a.blocks_per_split, end_block) - cta_first);

  // The warp's share of the work: units (single warps, or pairs of warps) take blocks. In a pair, heads of
  // two tiles give each warp one half (`mine_half`: its K and V tiles, query and output channels); 9–16
  // query heads of one tile give one warp the K tile (role 0: the scores) and the other the V tile (role
  // 1: softmax and outputs), so that no warp holds both the queries and the outputs of 16 heads.
  constexpr bool kSplitKV = splits_key_value(P, H);
  constexpr bool kPaired = works_in_pairs(P, H);
  static_assert(!kPaired || NW % 2 == 0, "pairs of warps");
  constexpr int kUnits = kPaired ? NW / 2 : NW;
  const int unit = kPaired ? warp / 2 : warp;
  const int role = kPaired ? warp % 2 : 0;
  const int mine_half = P == 2 ? role : 0;

  const SharedLayout layout =
      shared_memory_layout(C, P, H, Src, NW, STAGES, a.tile_stride, a.blocks_per_split);
  // The warp's tiles of a block (K, then V) are copied in slots, each completing on its own mbarrier: one
  // slot a tile over BF16 caches, so that a key tile's buffer is refilled as soon as the scores are taken;
  // one slot for both over FP8 caches, whose smaller tiles make a second wait and copy call a block cost
  // more time than the earlier refill saves. Slot j is slot j % kSlots of the warp's block j / kSlots, held
  // in buffer j % kRing (stage-major) behind mbarrier j % kRing.
  constexpr int kWarpTiles = kSplitKV ? 1 : 2;
  constexpr int kSlotTiles = tiles_per_copy_slot(Src, kWarpTiles);
  constexpr int kSlots = kWarpTiles / kSlotTiles;
  constexpr int kRing = STAGES * kSlots;
  const uint32_t stage_bytes = kWarpTiles * a.tile_stride;  // the warp's K tile, then its V tile
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + layout.bars);
  uint64_t* my_bars = bars + warp * kRing;
  uint64_t* pair_bars = bars + NW * kRing;  // pairs of warps only
  uint32_t* ents = reinterpret_cast<uint32_t*>(smem + layout.entries);
  const uint8_t* bases = smem + layout.bases;

  // The CTA's entries and the warps' barriers first, so the first copies start early.
  for (int i = tid; i < cta_blocks; i += NW * 32) {
    const uint32_t row = a.batch.rows[row0 + cta_first + i];
    if (row == kNoRow) {
#pragma unroll
      for (int j = 0; j < kTiles; ++j) ents[i * kTiles + j] = kAbsentEntry;
      continue;
    }
    const uint32_t* e = a.cache.entries + a.cache.geometry.entry_index(a.layer, row, kvh, TensorKind::key, 0);
    if constexpr (kTiles == 2) {
      const uint2 x = *reinterpret_cast<const uint2*>(e);
      ents[2 * i] = x.x, ents[2 * i + 1] = x.y;
    } else {
      const uint4 x = *reinterpret_cast<const uint4*>(e);
      ents[4 * i] = x.x, ents[4 * i + 1] = x.y, ents[4 * i + 2] = x.z, ents[4 * i + 3] = x.w;
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int s = 0; s < kRing; ++s) ptx::mbarrier_init(&my_bars[s], 1);
    // A pair's two score-exchange barriers (one per block parity): all 64 threads arrive.
    if (kPaired && role == 0) ptx::mbarrier_init(&pair_bars[2 * unit], 64), ptx::mbarrier_init(&pair_bars[2 * unit + 1], 64);
    ptx::fence_barrier_init();
  }
  __syncthreads();

  // Q fragments of the warp's half (B operand, columns = query heads of this KV head, 8 per column
  // block; heads ≥ group are zero).
  uint32_t qf[kBlocks][kSteps][2];
#pragma unroll
  for (int cb = 0; cb < kBlocks; ++cb) {
    const int head = 8 * cb + g;
    const bool real = head < heads;
    const uint32_t* qrow = reinterpret_cast<const uint32_t*>(
        a.q + (static_cast<size_t>(seq) * a.q_heads + kvh * a.group + head0 + (real ? head : 0)) * kD);
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      qf[cb][s][0] = real ? qrow[(mine_half * C + 16 * s) / 2 + t] : 0u;
      qf[cb][s][1] = real ? qrow[(mine_half * C + 16 * s + 8) / 2 + t] : 0u;
    }
  }

  const int mine = cta_blocks > unit ? (cta_blocks - unit + kUnits - 1) / kUnits : 0;
  uint8_t* my_stages = smem + layout.stages + static_cast<uint32_t>(warp * STAGES) * stage_bytes;
  // The warp's tiles of a block among the block's kTiles entries: its K tile, then its V tile; when pairs
  // split K and V, its one tile, then an absent entry that nothing copies or reads.
  const auto warp_entries = [&](const uint32_t* e, uint32_t (&ent)[2]) {
    if constexpr (kSplitKV) ent[0] = e[role], ent[1] = kAbsentEntry;
    else ent[0] = e[mine_half], ent[1] = e[P + mine_half];
  };

  // Starts the copies of the warp's slot j (see kRing) into its buffer.
  const auto issue = [&](int j) {
    uint32_t e[2];
    warp_entries(ents + (unit + kUnits * (j / kSlots)) * kTiles, e);
    // The slot's tiles (selected, not indexed: an index would put e in local memory).
    const uint32_t first = kSlots == 2 && j % kSlots != 0 ? e[1] : e[0];
    const uint32_t entries[2] = {first, e[1]};
    uint8_t* buffer = my_stages + static_cast<uint32_t>((j % kRing) * kSlotTiles) * a.tile_stride;
    uint64_t* bar = &my_bars[j % kRing];
    if constexpr (is_compressed(Src)) {
      // A compressed tile is copied whole (raw tiles are read from global memory).
      if (lane == 0) {
        uint32_t bytes = 0;
#pragma unroll
        for (int t = 0; t < kSlotTiles; ++t)
          bytes += entry_class(entries[t]) == TileClass::compressed ? a.cache.geometry.unit_bytes : 0u;
        ptx::mbarrier_arrive_expect_tx(bar, bytes);
#pragma unroll
        for (int t = 0; t < kSlotTiles; ++t)
          if (entry_class(entries[t]) == TileClass::compressed)
            ptx::bulk_copy_to_shared(buffer + t * a.tile_stride,
                                     a.cache.units + a.cache.geometry.unit_offset(entry_unit(entries[t])),
                                     a.cache.geometry.unit_bytes, bar);
      }
    } else {
      constexpr uint32_t kRowBytes = is_fp8(Src) ? C : 2 * C;
      constexpr uint32_t kRowStride = is_fp8(Src) ? fp8_row_stride(C) : bf16_row_stride(C);
      if (lane == 0) {
        uint32_t bytes = 0;
#pragma unroll
        for (int t = 0; t < kSlotTiles; ++t) bytes += entry_class(entries[t]) == TileClass::raw ? 16 * kRowBytes : 0u;
        ptx::mbarrier_arrive_expect_tx(bar, bytes);
      }
      __syncwarp();
      // Lane r copies row r % 16 of the slot's tile r / 16.
      const int t = lane / 16;
      const uint32_t entry = t == 0 ? entries[0] : entries[1];
      if (t < kSlotTiles && entry_class(entry) == TileClass::raw)
        ptx::bulk_copy_to_shared(buffer + t * a.tile_stride + (lane % 16) * kRowStride,
                                 a.cache.units + a.cache.geometry.unit_offset(entry_unit(entry)) + (lane % 16) * kRowBytes,
                                 kRowBytes, bar);
    }
  };
  // Done with slot v of the warp's i-th block: its buffer takes the same slot of block i + STAGES.
  const auto release = [&](int i, int v) {
    __syncwarp();
    if (i + STAGES < mine) issue(kSlots * (i + STAGES) + v);
  };

  // Online-softmax state of the lane's two query heads 2t and 2t+1 (log2 domain): the reference
  // maximum m (raised only when a block's maximum passes it by more than kRescaleSlack, so the
  // accumulators are rarely rescaled) and the lane's part of the sum l (its tokens g and g+8).
  float m_run[kBlocks][2], l_run[kBlocks][2];
  float o[kBlocks][kSteps][4];  // the warp's half of the output channels
#pragma unroll
  for (int cb = 0; cb < kBlocks; ++cb) {
    m_run[cb][0] = m_run[cb][1] = -INFINITY;
    l_run[cb][0] = l_run[cb][1] = 0.0f;
#pragma unroll
    for (int p = 0; p < kSteps; ++p) o[cb][p][0] = o[cb][p][1] = o[cb][p][2] = o[cb][p][3] = 0.0f;
  }
  uint32_t sink = 0;

  for (int j = 0; j < kRing && j < kSlots * mine; ++j) issue(j);

  // The lane-interleaved base words of this (layer, head) and an FP8 cache's widening table, while the
  // first tiles are in flight.
  if constexpr (is_compressed(Src)) {
    constexpr uint32_t kVectors = lane_base_words(C, P) / 4;
    const uint4* src = reinterpret_cast<const uint4*>(a.cache.lane_bases + lane_bases_index(a.cache.geometry, a.layer, kvh));
    uint4* dst = reinterpret_cast<uint4*>(smem + layout.bases);
    for (uint32_t i = static_cast<uint32_t>(tid); i < kVectors; i += NW * 32) dst[i] = src[i];
  }
  const uint16_t* table = reinterpret_cast<const uint16_t*>(smem + layout.widening);
  const uint32_t* spread = reinterpret_cast<const uint32_t*>(smem + layout.spread);
  if constexpr (is_fp8(Src)) {
    for (int i = tid; i < 128; i += NW * 32)
      reinterpret_cast<uint32_t*>(smem + layout.widening)[i] = reinterpret_cast<const uint32_t*>(a.cache.widening)[i];
  }
  if constexpr (is_fp8(Src) && is_compressed(Src)) {
    for (int i = tid; i < lane::kSpreadEntries; i += NW * 32)
      reinterpret_cast<uint32_t*>(smem + layout.spread)[i] = lane::spread_entry(static_cast<uint32_t>(i));
  }
  __syncthreads();

  // Rebuilds the compressed tile at `tile` (a key tile when `key` is true) group by group into `use`
  // (decode_slot's callback); a GAAC-FP8 tile holding a NaN or infinity code through the table.
  const auto rebuild = [&](auto key, const uint8_t* tile, uint32_t offset, int half, uint32_t entry, const auto& use) {
    constexpr bool kKey = decltype(key)::value;
    // The two sections of base words: BF16 b3 and b4 − b3, FP8 b2 and b3 (lane_bases.hpp).
    const uint4* first = base_words<C>(bases, half, kKey, false);
    const uint4* second = base_words<C>(bases, half, kKey, true);
    if constexpr (Src == TileSource::gaac) {
      decode_slot<C, kKey>(tile, lane, offset, first, second, use);
    } else if constexpr (is_compressed(Src)) {
      if (special_tile(a.cache, entry))
        decode_fp8_slot<C, F, kKey, true>(tile, lane, offset, first, second, spread, table, use);
      else
        decode_fp8_slot<C, F, kKey, false>(tile, lane, offset, first, second, spread, table, use);
    }
  };

  // Work::no_decode: a compressed tile's quads as loaded, without the rebuild.
  const auto loaded_quads = [&](const uint8_t* tile, uint32_t (&r0)[C / 8], uint32_t (&r1)[C / 8]) {
    lane::LaneSlot<C> s;
    lane::load_lane_slot<C>(tile, lane, s);
#pragma unroll
    for (int q = 0; q < C / 8; ++q) r0[q] = s.sm[q], r1[q] = s.sm[q] ^ s.words[q % 3];
  };

  // Pairs exchange a block's scores here: [warp][block parity][lane][column block] (two parities, so a
  // warp writes block i + 1's while its partner may still read block i's). Halves add theirs; a key
  // warp hands its scores to its value warp.
  float4* exchange = reinterpret_cast<float4*>(smem + layout.exchange);
  const auto meet = [&](int i) {  // the pair's meeting of block i, the (i / 2)-th use of its parity's barrier
    ptx::mbarrier_arrive(&pair_bars[2 * unit + (i & 1)]);
    ptx::mbarrier_wait(&pair_bars[2 * unit + (i & 1)], static_cast<uint32_t>(i >> 1) & 1u);
  };

  // The work on the warp's i-th block: all of it, or (pairs splitting K and V) its key or value part.
  const auto block = [&](int i, auto part) {
    constexpr Part kPart = decltype(part)::value;
    // Both tiles first: one warp scan gives the escape offsets of both.
#pragma unroll
    for (int v = 0; v < kSlots; ++v)
      ptx::mbarrier_wait(&my_bars[(kSlots * i + v) % kRing], static_cast<uint32_t>(i / STAGES) & 1u);
    const uint8_t* stage = my_stages + static_cast<uint32_t>(i % STAGES) * stage_bytes;
    const uint32_t* e = ents + (unit + kUnits * i) * kTiles;
    uint32_t ent[2];  // the warp's tiles of the block (warp_entries)
    warp_entries(e, ent);
    const int tok0 = (cta_first + unit + kUnits * i) * kTileTokens;

    if constexpr (W == Work::load_only) {
#pragma unroll
      for (int j = 0; j < kWarpTiles; ++j) sink ^= *reinterpret_cast<const uint32_t*>(stage + j * a.tile_stride + 4 * lane);
      if constexpr (kSlots == 2) release(i, 0);
    } else {
      bool key_absent = false;
#pragma unroll
      for (int h = 0; h < P; ++h) key_absent |= entry_class(e[h]) == TileClass::absent;
      uint32_t offset[2];
      if constexpr (is_compressed(Src) && W != Work::no_decode) escape_offsets<C, Src, 2>(stage, a.tile_stride, ent, lane, offset);

      // Sᵀ = K·Qᵀ: the key tile is the A operand (token rows g and g+8, channel step s: quads s and
      // kSteps + s), Q the B operand (heads as columns: no zero rows), two accumulation chains per
      // column block. sacc[cb][c]: token g heads 8cb + 2t, +1, then token g+8 heads 8cb + 2t, +1.
      float sacc[kBlocks][2][4];
#pragma unroll
      for (int cb = 0; cb < kBlocks; ++cb)
#pragma unroll
        for (int c = 0; c < 2; ++c) sacc[cb][c][0] = sacc[cb][c][1] = sacc[cb][c][2] = sacc[cb][c][3] = 0.0f;
      if constexpr (kPart != Part::value) {
        const TileClass cls = entry_class(ent[0]);
        const uint8_t* tile = stage;
        if (is_compressed(Src) && W != Work::no_decode && cls == TileClass::compressed) {
          uint32_t low0[kSteps], low1[kSteps];  // token half 0 of a channel step, until half 1 arrives
          rebuild(std::true_type{}, tile, offset[0], mine_half, ent[0],
                  [&](auto group, const uint32_t (&r0)[2], const uint32_t (&r1)[2]) {
#pragma unroll
                    for (int q = 0; q < 2; ++q) {
                      const int quad = 2 * decltype(group)::value + q, h = quad / kSteps, st = quad % kSteps;
                      if (h == 0) {
                        low0[st] = r0[q], low1[st] = r1[q];
                      } else if constexpr (kMath) {
#pragma unroll
                        for (int cb = 0; cb < kBlocks; ++cb)
                          ptx::mma_bf16(sacc[cb][st & 1], low0[st], r0[q], low1[st], r1[q], qf[cb][st][0], qf[cb][st][1]);
                      } else {
                        sink ^= low0[st] ^ low1[st] ^ r0[q] ^ r1[q];
                      }
                    }
                  });
        } else {
          KeyFragments<C> kf;
          if (Src == TileSource::gaac && cls == TileClass::compressed) {  // Work::no_decode
            uint32_t r0[C / 8], r1[C / 8];
            loaded_quads(tile, r0, r1);
            key_from_quads<C>(r0, r1, kf);
          } else if (cls == TileClass::raw) {
            if constexpr (Src == TileSource::bf16) {
              key_from_bf16_tile<C>(tile, lane, kf);
            } else if constexpr (Src == TileSource::gaac) {
              key_from_raw<C>(raw_rows(a, ent[0]), lane, kf);
            } else {  // FP8: the twin's staged rows, or a raw tile's rows in global memory
              const RawRows rows = kPlainFp8 ? RawRows{tile, tile + 8 * fp8_row_stride(C)} : raw_rows(a, ent[0]);
              const uint32_t stride = kPlainFp8 ? fp8_row_stride(C) : C;
              if (special_tile(a.cache, ent[0])) key_from_fp8_rows<C, F, true>(rows.low, rows.high, stride, lane, table, kf);
              else key_from_fp8_rows<C, F, false>(rows.low, rows.high, stride, lane, table, kf);
            }
          } else {
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
              for (int s = 0; s < kSteps; ++s) kf[h][s][0] = kf[h][s][1] = 0u;
          }
          if constexpr (kMath) {
#pragma unroll
            for (int cb = 0; cb < kBlocks; ++cb)
#pragma unroll
              for (int s = 0; s < kSteps; ++s)
                ptx::mma_bf16(sacc[cb][s & 1], kf[0][s][0], kf[1][s][0], kf[0][s][1], kf[1][s][1], qf[cb][s][0], qf[cb][s][1]);
          } else {
            sink ^= fold<4 * kSteps>(&kf[0][0][0]);
          }
        }
      }
      if constexpr (kSlots == 2) release(i, 0);  // the key tile is used: its buffer takes the next one

      // Online softmax over the block's 16 tokens. Scores are scaled into the log2 domain inside the
      // exponent's argument (one FFMA); a head's reference maximum moves only when the block's
      // maximum passes it by more than kRescaleSlack, and the accumulators are rescaled only when
      // some head of the warp moved (probabilities stay below 2^kRescaleSlack).
      uint32_t pb0[kBlocks] = {}, pb1[kBlocks] = {};
      if constexpr (kMath) {
        float x[kBlocks][4];
        if constexpr (kPart != Part::value) {
#pragma unroll
          for (int cb = 0; cb < kBlocks; ++cb)
#pragma unroll
            for (int k = 0; k < 4; ++k) x[cb][k] = sacc[cb][0][k] + sacc[cb][1][k];
        }
        // A pair meets on an mbarrier rather than a named barrier, so that compute-sanitizer's racecheck
        // follows the ordering.
        float4* my_scores = exchange + ((warp * 2 + (i & 1)) * 32 + lane) * kBlocks;
        const float4* partner_scores = exchange + (((warp ^ 1) * 2 + (i & 1)) * 32 + lane) * kBlocks;
        // A key warp hands its scores to its value warp; halves of a head add theirs: mine + my partner's in
        // one warp, the partner's + mine in the other, the same sums (addition commutes), so both run the
        // same softmax.
        if constexpr (kPaired) {
          if constexpr (kPart != Part::value) {
#pragma unroll
            for (int cb = 0; cb < kBlocks; ++cb) my_scores[cb] = make_float4(x[cb][0], x[cb][1], x[cb][2], x[cb][3]);
          }
          meet(i);
#pragma unroll
          for (int cb = 0; cb < kBlocks; ++cb) {
            const float4 other = partner_scores[cb];
            if constexpr (kPart == Part::value) x[cb][0] = other.x, x[cb][1] = other.y, x[cb][2] = other.z, x[cb][3] = other.w;
            if constexpr (kPart == Part::all) x[cb][0] += other.x, x[cb][1] += other.y, x[cb][2] += other.z, x[cb][3] += other.w;
          }
        }
        if constexpr (kPart != Part::key) {
          if (key_absent || tok0 < first || tok0 + kTileTokens > len) {
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              const int pos = tok0 + g + 8 * (k / 2);
              if (key_absent || pos < first || pos >= len)
#pragma unroll
                for (int cb = 0; cb < kBlocks; ++cb) x[cb][k] = -INFINITY;
            }
          }
          float mx[kBlocks][2];
#pragma unroll
          for (int cb = 0; cb < kBlocks; ++cb)
#pragma unroll
            for (int j = 0; j < 2; ++j) mx[cb][j] = fmaxf(x[cb][j], x[cb][2 + j]);
#pragma unroll
          for (int d = 4; d < 32; d <<= 1)
#pragma unroll
            for (int cb = 0; cb < kBlocks; ++cb)
#pragma unroll
              for (int j = 0; j < 2; ++j) mx[cb][j] = fmaxf(mx[cb][j], __shfl_xor_sync(0xFFFFFFFFu, mx[cb][j], d));
          // A head's first reference needs no rescaling (its accumulators are still zero).
          bool rescale = false;
          float alpha[kBlocks][2];
#pragma unroll
          for (int cb = 0; cb < kBlocks; ++cb)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              mx[cb][j] *= a.scale_log2;
              const bool moves = mx[cb][j] > m_run[cb][j] + kRescaleSlack;
              alpha[cb][j] = moves ? ptx::exp2_approx(m_run[cb][j] - mx[cb][j]) : 1.0f;
              rescale |= moves && m_run[cb][j] != -INFINITY;
              m_run[cb][j] = moves ? mx[cb][j] : m_run[cb][j];
            }
          if (__any_sync(0xFFFFFFFFu, rescale)) {
#pragma unroll
            for (int cb = 0; cb < kBlocks; ++cb) {
#pragma unroll
              for (int j = 0; j < 2; ++j) l_run[cb][j] *= alpha[cb][j];
#pragma unroll
              for (int p = 0; p < kSteps; ++p) {
                float* acc = o[cb][p];
                acc[0] *= alpha[cb][0], acc[1] *= alpha[cb][1], acc[2] *= alpha[cb][0], acc[3] *= alpha[cb][1];
              }
            }
          }
#pragma unroll
          for (int cb = 0; cb < kBlocks; ++cb) {
            float pr[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              const float base = m_run[cb][k % 2] == -INFINITY ? 0.0f : m_run[cb][k % 2];
              pr[k] = ptx::exp2_approx(fmaf(x[cb][k], a.scale_log2, -base));
            }
            l_run[cb][0] += pr[0] + pr[2];
            l_run[cb][1] += pr[1] + pr[3];
            // Pᵀ as the B operand of Vᵀ·Pᵀ (tokens 2t, 2t+1 | 2t+8, 2t+9 of head 8cb + g): the transposes of
            // the lane's (token g | g+8; heads 8cb + 2t, +1) pairs.
            pb0[cb] = ptx::movmatrix_trans(ptx::pack_bf16(pr[0], pr[1]));
            pb1[cb] = ptx::movmatrix_trans(ptx::pack_bf16(pr[2], pr[3]));
          }
        }
      }

      // Oᵀ += Vᵀ·Pᵀ over the warp's value tile (the first of its stage when pairs split K and V).
      if constexpr (kPart != Part::key) {
        constexpr int v = kSplitKV ? 0 : 1;
        const TileClass cls = entry_class(ent[v]);
        const uint8_t* tile = stage + v * a.tile_stride;
        if (is_compressed(Src) && W != Work::no_decode && cls == TileClass::compressed) {
          rebuild(std::false_type{}, tile, offset[v], mine_half, ent[v],
                  [&](auto group, const uint32_t (&r0)[2], const uint32_t (&r1)[2]) {
                    if constexpr (kMath) {
#pragma unroll
                      for (int cb = 0; cb < kBlocks; ++cb)
                        ptx::mma_bf16(o[cb][decltype(group)::value], r0[0], r0[1], r1[0], r1[1], pb0[cb], pb1[cb]);
                    } else
                      sink ^= r0[0] ^ r0[1] ^ r1[0] ^ r1[1];
                  });
        } else {
          ValueFragments<C> vf;
          if (Src == TileSource::gaac && cls == TileClass::compressed) {  // Work::no_decode
            uint32_t r0[C / 8], r1[C / 8];
            loaded_quads(tile, r0, r1);
            value_from_quads<C>(r0, r1, vf);
          } else if (cls == TileClass::raw) {
            if constexpr (Src == TileSource::bf16) {
              value_from_bf16_tile<C>(tile, lane, vf);
            } else if constexpr (Src == TileSource::gaac) {
              value_from_raw<C>(raw_rows(a, ent[v]), lane, vf);
            } else if constexpr (kPlainFp8) {
              if (special_tile(a.cache, ent[v])) value_from_fp8_tile<C, F, true>(tile, lane, table, vf);
              else value_from_fp8_tile<C, F, false>(tile, lane, table, vf);
            } else {
              if (special_tile(a.cache, ent[v])) value_from_fp8_raw<C, F, true>(raw_rows(a, ent[v]), lane, table, vf);
              else value_from_fp8_raw<C, F, false>(raw_rows(a, ent[v]), lane, table, vf);
            }
          } else {
#pragma unroll
            for (int p = 0; p < kSteps; ++p) vf[p][0] = vf[p][1] = vf[p][2] = vf[p][3] = 0u;
          }
          if constexpr (kMath) {
#pragma unroll
            for (int cb = 0; cb < kBlocks; ++cb)
#pragma unroll
              for (int p = 0; p < kSteps; ++p) ptx::mma_bf16(o[cb][p], vf[p][0], vf[p][1], vf[p][2], vf[p][3], pb0[cb], pb1[cb]);
          } else {
            sink ^= fold<4 * kSteps>(&vf[0][0]);
          }
        }
      }
    }
    release(i, kSlots - 1);
  };

  // Units meet in shared memory: their softmax states and outputs. The two warps of a pair of halves hold
  // the same m and l and each its half of the channels; of a pair splitting K and V, the value warp holds
  // them all.
  float* wm = reinterpret_cast<float*>(smem + layout.warp_merge);  // [unit][head]
  float* wl = wm + kUnits * H;
  float* wo = wl + kUnits * H;  // [unit][head][channel]
  const auto publish = [&]() {
    float l_sum[kBlocks][2];
#pragma unroll
    for (int cb = 0; cb < kBlocks; ++cb)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        l_sum[cb][j] = l_run[cb][j];
#pragma unroll
        for (int d = 4; d < 32; d <<= 1) l_sum[cb][j] += __shfl_xor_sync(0xFFFFFFFFu, l_sum[cb][j], d);
      }
    if (g == 0 && mine_half == 0) {
#pragma unroll
      for (int cb = 0; cb < kBlocks; ++cb)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          wm[unit * H + 8 * cb + 2 * t + j] = m_run[cb][j];
          wl[unit * H + 8 * cb + 2 * t + j] = l_sum[cb][j];
        }
    }
#pragma unroll
    for (int cb = 0; cb < kBlocks; ++cb)
#pragma unroll
      for (int p = 0; p < kSteps; ++p)
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int head = 8 * cb + 2 * t + k % 2;
          const int channel = mine_half * C + 16 * p + (kPlainFp8 ? 2 * g + k / 2 : g + 8 * (k / 2));
          wo[(unit * H + head) * kD + channel] = o[cb][p][k];
        }
  };

  if constexpr (kSplitKV) {
    // Two loops, so that a key warp's registers hold no outputs and a value warp's no queries. The value
    // warps publish into a region of their own while key warps may still read their stages.
    if (role == 0) {
      for (int i = 0; i < mine; ++i) block(i, std::integral_constant<Part, Part::key>{});
    } else {
      for (int i = 0; i < mine; ++i) block(i, std::integral_constant<Part, Part::value>{});
      publish();
    }
    __syncthreads();
  } else {
    for (int i = 0; i < mine; ++i) block(i, std::integral_constant<Part, Part::all>{});
    __syncthreads();  // the stages are idle now (every copy issued has been waited for): the merge reuses them
    publish();
    __syncthreads();
  }
  if (sink == a.sink_magic && a.sink_magic != 0u) a.partial_ml[0] = 1.0f;  // keeps the sink alive

  // The workspace holds every head of a (sequence, KV head) pair; this CTA's heads start at head0.
  const int group = a.group;
  const size_t pair = static_cast<size_t>(seq) * a.cache.geometry.kv_heads + kvh;
  uint16_t* out = a.out + (static_cast<size_t>(seq) * a.q_heads + kvh * group + head0) * kD;
  for (int idx = tid; idx < heads * kD; idx += NW * 32) {
    const int head = idx / kD, channel = idx % kD;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kUnits; ++w) mx = fmaxf(mx, wm[w * H + head]);
    float l = 0.0f, acc = 0.0f;
    if (mx != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kUnits; ++w) {
        const float f = ptx::exp2_approx(wm[w * H + head] - mx);
        l += wl[w * H + head] * f;
        acc += wo[(w * H + head) * kD + channel] * f;
      }
    }
    if (splits == 1) {
      out[idx] = static_cast<uint16_t>(ptx::pack_bf16((l > 0.0f ? acc / l : 0.0f) * a.out_scale, 0.0f) & 0xFFFFu);
    } else {
      const size_t at = (pair * a.max_splits + split) * group + head0 + head;
      a.partial_o[at * kD + channel] = acc;
      if (channel == 0) a.partial_ml[2 * at] = mx, a.partial_ml[2 * at + 1] = l;
    }
  }
  if (splits == 1) return;

  // Two-level merge: the last CTA of each merge group merges the group's splits; the last group to be
  // merged merges the groups. Arrival order changes who merges, never the order of the sums.
  const int per_group = a.merge_group;
  const int groups = (splits + per_group - 1) / per_group;
  const int my_group = split / per_group;
  const int group_first = my_group * per_group;
  const int group_count = min(per_group, splits - group_first);
  uint32_t* counters = a.counters + (pair * a.head_slices + blockIdx.y % a.head_slices) * (a.max_groups + 1);
  int* flag = reinterpret_cast<int*>(smem + layout.flag);
  const size_t part0 = pair * a.max_splits * group + head0;   // partial (split 0, head head0) of this pair
  const size_t group0 = pair * a.max_groups * group + head0;  // merged group 0 of this pair, head head0
  if (!last_to_arrive(&counters[my_group], group_count, flag, tid)) return;
  if (groups == 1) {
    merge_partials<NW, H, kD, true>(a.partial_o, a.partial_ml, part0 + group_first * group, group_count, heads, group,
                                    smem + layout.stages, out, nullptr, nullptr, a.out_scale, tid);
    if (tid == 0) counters[my_group] = 0u;
    return;
  }
  merge_partials<NW, H, kD, false>(a.partial_o, a.partial_ml, part0 + group_first * group, group_count, heads, group,
                                   smem + layout.stages, nullptr, a.group_o + (group0 + my_group * group) * kD,
                                   a.group_ml + 2 * (group0 + my_group * group), a.out_scale, tid);
  if (tid == 0) counters[my_group] = 0u;
  if (!last_to_arrive(&counters[a.max_groups], groups, flag, tid)) return;
  merge_partials<NW, H, kD, true>(a.group_o, a.group_ml, group0, groups, heads, group, smem + layout.stages, out, nullptr,
                                  nullptr, a.out_scale, tid);
  if (tid == 0) counters[a.max_groups] = 0u;
}

}  // namespace gaac::cuda::detail
