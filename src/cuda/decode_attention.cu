// Host side of decode attention: the split plan, the choice of kernel instance and the launch.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>
#include <unordered_map>

#include "cuda/check.hpp"
#include "cuda/decode_kernel.cuh"
#include "gaac/cuda.hpp"
#include "gaac/error.hpp"

namespace gaac::cuda {
namespace {

using detail::DecodeArgs;
using detail::TileSource;

/// A kernel instance and what it needs to be launched.
struct KernelChoice {
  void (*kernel)(DecodeArgs) = nullptr;
  int stages = 0;
  uint32_t tile_stride = 0;
};

template <int C, int P, TileSource Src, detail::Work W, int Stages>
KernelChoice choice(uint32_t unit_bytes) {
  KernelChoice k;
  k.kernel = detail::decode_attention_kernel<C, P, Src, W, detail::kDecodeWarps, Stages>;
  k.stages = Stages;
  k.tile_stride = Src == TileSource::gaac ? unit_bytes + 16u : 16u * detail::bf16_row_stride(C);
  return k;
}

/// Default stages per warp (measured, docs/performance.md): the GAAC kernel is bound by instruction
/// latency, so it takes two stages and three CTAs per SM; the twin three stages, two CTAs per SM; a
/// head_dim-256 stage holds four tiles, so two.
template <TileSource Src, int P>
constexpr int kDefaultStages = P == 2 ? 2 : Src == TileSource::gaac ? 2 : 3;

/// The instances that exist: every head width with the default stages; for head_dim 128 also 2, 3
/// and 4 stages and the breakdown variants.
template <int C, int P, TileSource Src>
KernelChoice pick(detail::Work work, int stages, uint32_t unit_bytes) {
  using detail::Work;
  constexpr int kDef = kDefaultStages<Src, P>;
  if (stages == 0) stages = kDef;
  if constexpr (C == 128 && P == 1) {
    if (work == Work::full) {
      if (stages == 2) return choice<C, P, Src, Work::full, 2>(unit_bytes);
      if (stages == 3) return choice<C, P, Src, Work::full, 3>(unit_bytes);
      if (stages == 4) return choice<C, P, Src, Work::full, 4>(unit_bytes);
    } else if (stages == kDef) {
      if (work == Work::no_math) return choice<C, P, Src, Work::no_math, kDef>(unit_bytes);
      if (work == Work::load_only) return choice<C, P, Src, Work::load_only, kDef>(unit_bytes);
      if constexpr (Src == TileSource::gaac)
        if (work == Work::no_decode) return choice<C, P, Src, Work::no_decode, kDef>(unit_bytes);
    }
  } else {
    if (work == Work::full && stages == kDef) return choice<C, P, Src, Work::full, kDef>(unit_bytes);
  }
  throw Error("decode_attention: no kernel for head width " + std::to_string(C * P) + " with " +
              std::to_string(stages) + " stages and work variant " + std::to_string(static_cast<int>(work)));
}

KernelChoice pick(const PagedGeometry& geo, bool compressed, detail::Work work, int stages) {
  const uint32_t u = geo.unit_bytes;
  switch (geo.head_dim) {
    case 64:
      return compressed ? pick<64, 1, TileSource::gaac>(work, stages, u) : pick<64, 1, TileSource::bf16>(work, stages, u);
    case 128:
      return compressed ? pick<128, 1, TileSource::gaac>(work, stages, u)
                        : pick<128, 1, TileSource::bf16>(work, stages, u);
    case 256:
      return compressed ? pick<128, 2, TileSource::gaac>(work, stages, u)
                        : pick<128, 2, TileSource::bf16>(work, stages, u);
    default:
      throw Error("decode_attention: head width " + std::to_string(geo.head_dim) + " is not 64, 128 or 256");
  }
}

/// Per-process facts about the device and the kernel instances (one device per process): the SM
/// count, each instance's raised shared-memory limit, its occupancy at a given shared-memory size.
/// Kept, so that a launch makes no runtime call but the launch itself.
class KernelFacts {
 public:
  static KernelFacts& get() {
    static KernelFacts facts;
    return facts;
  }
  int sms() {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (sms_ == 0) {
      int device = 0;
      check(cudaGetDevice(&device), "cudaGetDevice");
      check(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
    }
    return sms_;
  }
  /// Resident CTAs per SM of `kernel` with `shared` bytes of dynamic shared memory (the first time,
  /// the instance is allowed the device's largest).
  int ctas_per_sm(void (*kernel)(DecodeArgs), size_t shared) {
    const std::lock_guard<std::mutex> lock(mutex_);
    const void* key = reinterpret_cast<const void*>(kernel);
    if (!limit_set_.count(key)) {
      int device = 0, most = 0;
      check(cudaGetDevice(&device), "cudaGetDevice");
      check(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "cudaDeviceGetAttribute");
      check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, most), "cudaFuncSetAttribute");
      limit_set_[key] = true;
    }
    const auto at = std::make_pair(key, shared);
    const auto it = occupancy_.find(at);
    if (it != occupancy_.end()) return it->second;
    int n = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, detail::kDecodeWarps * 32, shared),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    occupancy_[at] = std::max(n, 1);
    return std::max(n, 1);
  }

 private:
  struct PairHash {
    size_t operator()(const std::pair<const void*, size_t>& p) const {
      return std::hash<const void*>()(p.first) ^ (std::hash<size_t>()(p.second) * 0x9E3779B97F4A7C15ull);
    }
  };
  std::mutex mutex_;
  int sms_ = 0;
  std::unordered_map<const void*, bool> limit_set_;
  std::unordered_map<std::pair<const void*, size_t>, int, PairHash> occupancy_;
};

size_t shared_bytes(const PagedGeometry& geo, bool compressed, const KernelChoice& k, int blocks) {
  const int c = geo.tile_channels(), p = geo.halves();
  return detail::plan_shared_memory(c, p, compressed ? TileSource::gaac : TileSource::bf16, detail::kDecodeWarps,
                                    k.stages, k.tile_stride, blocks)
      .total;
}

void check_config(const DeviceCache& cache, const DecodeConfig& config) {
  const PagedGeometry& geo = cache.view().geometry;
  if (config.layer < 0 || config.layer >= geo.layers) throw Error("decode_attention: layer out of range");
  if (config.q_heads <= 0 || config.q_heads % geo.kv_heads != 0 || config.q_heads / geo.kv_heads > 8)
    throw Error("decode_attention: q_heads must be a multiple of the KV heads, at most 8 per KV head (got " +
                std::to_string(config.q_heads) + " for " + std::to_string(geo.kv_heads) + ")");
  if (config.blocks_per_split < 0 || config.plan_tokens < 0 || config.stages < 0)
    throw Error("decode_attention: blocks_per_split, plan_tokens and stages must be 0 (chosen) or positive");
  if (config.work == Work::no_decode && !cache.compressed())
    throw Error("decode_attention: the no_decode variant needs a compressed cache");
}

}  // namespace

DecodePlan plan_decode(const DeviceCache& cache, const DeviceSequences& sequences, const DecodeConfig& config) {
  check_config(cache, config);
  const PagedGeometry& geo = cache.view().geometry;
  const KernelChoice k = pick(geo, cache.compressed(), static_cast<detail::Work>(config.work), config.stages);
  const int window = cache.window(config.layer);
  int longest = 1;
  for (int s = 0; s < sequences.sequences(); ++s) longest = std::max(longest, sequences.attended_blocks(s, window));
  if (config.plan_tokens > 0) {
    const int first = first_attended(config.plan_tokens - 1, window) / kTileTokens;
    longest = std::max(longest, (config.plan_tokens + kTileTokens - 1) / kTileTokens - first);
  }

  DecodePlan plan;
  KernelFacts& facts = KernelFacts::get();
  const auto occupancy = [&](int blocks) {
    return facts.ctas_per_sm(k.kernel, shared_bytes(geo, cache.compressed(), k, blocks));
  };
  if (config.blocks_per_split > 0) {
    plan.blocks_per_split = config.blocks_per_split;
  } else {
    // One wave: the CTAs a GPU holds at once, shared equally among the (sequence, KV head) pairs, with
    // at least two blocks for each warp. The occupancy is taken at a typical split, then at the chosen one.
    const int pairs = sequences.sequences() * geo.kv_heads;
    const auto blocks_for = [&](int per_sm) {
      const int splits = std::max(1, facts.sms() * per_sm / pairs);
      return std::max((longest + splits - 1) / splits, 2 * detail::kDecodeWarps);
    };
    plan.blocks_per_split = std::min(blocks_for(occupancy(128)), detail::kMaxBlocksPerSplit);
    plan.blocks_per_split = std::min(blocks_for(occupancy(plan.blocks_per_split)), detail::kMaxBlocksPerSplit);
  }
  plan.blocks_per_split = std::clamp(plan.blocks_per_split, 1, detail::kMaxBlocksPerSplit);
  plan.max_splits = (longest + plan.blocks_per_split - 1) / plan.blocks_per_split;
  if (plan.max_splits > detail::kMaxSplits)
    plan.blocks_per_split = (longest + detail::kMaxSplits - 1) / detail::kMaxSplits,
    plan.max_splits = (longest + plan.blocks_per_split - 1) / plan.blocks_per_split;
  if (plan.blocks_per_split > detail::kMaxBlocksPerSplit) throw Error("decode_attention: context too long");
  // One merge level up to 48 splits (one CTA reads them all); beyond, groups of about sqrt(splits).
  plan.merge_group = plan.max_splits <= 48 ? std::max(plan.max_splits, 1)
                                           : static_cast<int>(std::ceil(std::sqrt(static_cast<double>(plan.max_splits))));
  plan.max_groups = (plan.max_splits + plan.merge_group - 1) / plan.merge_group;
  plan.shared_bytes = shared_bytes(geo, cache.compressed(), k, plan.blocks_per_split);
  plan.ctas_per_sm = occupancy(plan.blocks_per_split);
  return plan;
}

DecodePlan decode_attention(const DeviceCache& cache, const DeviceSequences& sequences, const DecodeConfig& config,
                            const uint16_t* q, uint16_t* out, DecodeWorkspace& workspace, Stream stream) {
  const DecodePlan plan = plan_decode(cache, sequences, config);
  const PagedGeometry& geo = cache.view().geometry;
  const KernelChoice k = pick(geo, cache.compressed(), static_cast<detail::Work>(config.work), config.stages);
  const int group = config.q_heads / geo.kv_heads;
  if (!workspace.fits(sequences.sequences(), geo.kv_heads, group, geo.head_dim, plan.max_splits, plan.max_groups))
    workspace = DecodeWorkspace(sequences.sequences(), geo.kv_heads, group, geo.head_dim,
                                std::max(plan.max_splits, workspace.split_capacity()),
                                std::max(plan.max_groups, workspace.group_capacity()));

  DecodeArgs a;
  a.geometry = geo;
  a.units = cache.view().units;
  a.entries = cache.view().entries;
  a.lane_bases = cache.lane_bases();
  a.layer = config.layer;
  a.window = cache.window(config.layer);
  a.sequences = sequences.sequences();
  a.indptr = sequences.view().indptr;
  a.rows = sequences.view().rows;
  a.lengths = sequences.view().lengths;
  a.q = q;
  a.out = out;
  a.q_heads = config.q_heads;
  a.group = group;
  const float scale = config.softmax_scale > 0.0f ? config.softmax_scale : 1.0f / std::sqrt(static_cast<float>(geo.head_dim));
  a.scale_log2 = scale * 1.4426950408889634f;
  a.blocks_per_split = plan.blocks_per_split;
  a.max_splits = workspace.split_capacity();  // strides of the workspace; the grid has plan.max_splits
  a.merge_group = plan.merge_group;
  a.max_groups = workspace.group_capacity();
  a.partial_o = workspace.partial_o();
  a.partial_ml = workspace.partial_ml();
  a.group_o = workspace.group_o();
  a.group_ml = workspace.group_ml();
  a.counters = workspace.counters();
  a.tile_stride = k.tile_stride;
  a.sink_magic = config.work == Work::full ? 0u : 0x9E3779B9u;

  const dim3 grid(static_cast<unsigned>(plan.max_splits), static_cast<unsigned>(geo.kv_heads),
                  static_cast<unsigned>(sequences.sequences()));
  k.kernel<<<grid, detail::kDecodeWarps * 32, plan.shared_bytes, stream>>>(a);
  check(cudaGetLastError(), "decode_attention launch");
  return plan;
}

}  // namespace gaac::cuda
