// Decode attention planned once per batch geometry and launched per layer: the kernel instance, the
// split of each sequence's context over CTAs (per sliding window), the workspace, and the launch.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda/check.hpp"
#include "cuda/decode_kernel.cuh"
#include "cuda/dispatch.hpp"
#include "gaac/cuda.hpp"
#include "gaac/error.hpp"

namespace gaac::cuda {
namespace {

using detail::DecodeArgs;
using detail::TileSource;

/// A kernel instance and what it needs to be launched.
struct KernelChoice {
  void (*kernel)(DecodeArgs) = nullptr;
  TileSource source = TileSource::gaac;
  int heads = 0;   ///< query heads per KV head it has room for
  int warps = 0;   ///< warps per CTA
  int stages = 0;  ///< stages per warp
  uint32_t tile_stride = 0;
};

template <int C, int P, int H, TileSource Src, Work W, int NW, int Stages>
KernelChoice choice(uint32_t unit_bytes) {
  KernelChoice k;
  k.kernel = detail::decode_attention_kernel<C, P, H, Src, W, NW, Stages>;
  k.source = Src;
  k.heads = H;
  k.warps = NW;
  k.stages = Stages;
  k.tile_stride = detail::stage_tile_bytes(Src, C, unit_bytes);
  return k;
}

/// Default warps per CTA (measured, docs/performance.md, kernels v9, v11 and v12): one CTA of 16 warps per
/// SM where 16 warps fit 128 registers each (up to 8 query heads per KV head, a head of 256 channels
/// worked on by pairs of warps, one tile each; 9–16 query heads of one tile by pairs that split K and V)
/// — fewer, longer CTAs: a quarter of the launches, of the prologues and of the splits to merge, and one
/// copy of the bases per SM; CTAs of 4 warps elsewhere.
template <int C, int P, int H>
constexpr int kDefaultWarps = H == 8 || detail::splits_key_value(P, H) ? 16 : detail::kDecodeWarps;

/// Default stages per warp (measured, docs/performance.md): the GAAC kernel is bound by instruction
/// latency, so it takes two stages and more warps per SM; the twin three stages, and in CTAs of 16
/// warps two for 64-channel tiles, one for 128 (two padded BF16 tiles per warp would not fit shared
/// memory). FP8 sources (not yet tuned) take two: the plain FP8 twin's tiles are half a BF16 tile's, so
/// two stages of 16 warps fit.
template <int C, int P, TileSource Src, int NW>
constexpr int kDefaultStages = Src == TileSource::bf16 && NW >= 16                  ? (C == 64 ? 2 : 1)
                               : detail::is_compressed(Src) || detail::is_fp8(Src) ? 2
                                                                                  : 3;

/// The instances that exist: for every head width and 8 or 16 query heads per KV head the default
/// warps and stages (kDefaultWarps, kDefaultStages), with the breakdown variants for head_dim 128, and
/// GAAC in CTAs of 16 warps with one stage (for the largest units); for
/// heads of 64 and 128 channels also CTAs of 4 warps, and for 128, 4 warps with 2, 3 or 4 stages and 8
/// warps (the measured alternatives).
template <int C, int P, int H, TileSource Src>
KernelChoice pick(Work work, int warps, int stages, uint32_t unit_bytes) {
  constexpr int NW = kDefaultWarps<C, P, H>;
  constexpr int kDef = kDefaultStages<C, P, Src, NW>;
  constexpr int kDef4 = kDefaultStages<C, P, Src, 4>;
  if (warps == 0) warps = NW;
  if (stages == 0) stages = warps == NW ? kDef : kDef4;  // 4 and 8 warps share theirs
  if constexpr (detail::is_fp8(Src)) {
    // FP8 caches: the default instance only (two stages of the largest FP8 units always fit; one and three
    // stages were measured for GAAC-FP8 and gave nothing: docs/performance.md).
    if (work == Work::full && warps == NW && stages == kDef) return choice<C, P, H, Src, Work::full, NW, kDef>(unit_bytes);
    throw Error("decode attention over an FP8 cache: only the default warps and stages of the full kernel exist "
                "(asked " + std::to_string(warps) + " warps, " + std::to_string(stages) + " stages)");
  }
  if (warps == NW && stages == kDef) {
    if (work == Work::full) return choice<C, P, H, Src, Work::full, NW, kDef>(unit_bytes);
    if constexpr (C == 128 && P == 1 && H == 8) {
      if (work == Work::no_math) return choice<C, P, H, Src, Work::no_math, NW, kDef>(unit_bytes);
      if (work == Work::load_only) return choice<C, P, H, Src, Work::load_only, NW, kDef>(unit_bytes);
      if constexpr (Src == TileSource::gaac)
        if (work == Work::no_decode) return choice<C, P, H, Src, Work::no_decode, NW, kDef>(unit_bytes);
    }
  }
  // One stage in CTAs of 16 warps: where two stages of the cache's tiles do not fit shared memory (the
  // largest escape capacities); the same arithmetic as two.
  if constexpr (H == 8 && Src == TileSource::gaac && kDef > 1)
    if (work == Work::full && warps == NW && stages == 1) return choice<C, P, H, Src, Work::full, NW, 1>(unit_bytes);
  if constexpr (P == 1 && H == 8) {
    if (work == Work::full && warps == 4 && stages == kDef4) return choice<C, P, H, Src, Work::full, 4, kDef4>(unit_bytes);
    if constexpr (C == 128) {
      if (work == Work::full && warps == 4) {
        if (stages == 2) return choice<C, P, H, Src, Work::full, 4, 2>(unit_bytes);
        if (stages == 3) return choice<C, P, H, Src, Work::full, 4, 3>(unit_bytes);
        if (stages == 4) return choice<C, P, H, Src, Work::full, 4, 4>(unit_bytes);
      }
      if (work == Work::full && warps == 8 && stages == kDef4) return choice<C, P, H, Src, Work::full, 8, kDef4>(unit_bytes);
    }
  }
  throw Error("decode attention: no kernel for head width " + std::to_string(C * P) + ", " + std::to_string(H) +
              " query heads per KV head, " + std::to_string(warps) + " warps, " + std::to_string(stages) +
              " stages and work variant " + std::to_string(static_cast<int>(work)));
}

/// CTAs that share each KV head's `group` query heads (DecodeConfig::heads_per_cta).
int head_slices(int group, const DecodeConfig& config) {
  return config.heads_per_cta == 8 ? (group + 7) / 8 : 1;
}

/// The kernel instance for a cache of tiles from `source` and `group` query heads per KV head (split
/// over head_slices CTAs).
KernelChoice pick(const PagedGeometry& geo, TileSource source, int group, const DecodeConfig& config) {
  const int heads = head_slices(group, config) > 1 ? 8 : group;  // query heads a CTA serves
  return detail::with_head_shape(geo.head_dim, "decode attention", [&]<int C, int P>() {
    return detail::with_query_heads(heads, "decode attention", [&]<int H>() {
      const auto instance = [&]<TileSource Src>() { return pick<C, P, H, Src>(config.work, config.warps, config.stages, geo.unit_bytes); };
      switch (source) {
        case TileSource::gaac: return instance.template operator()<TileSource::gaac>();
        case TileSource::bf16: return instance.template operator()<TileSource::bf16>();
        case TileSource::gaac_e4m3: return instance.template operator()<TileSource::gaac_e4m3>();
        case TileSource::gaac_e5m2: return instance.template operator()<TileSource::gaac_e5m2>();
        case TileSource::e4m3: return instance.template operator()<TileSource::e4m3>();
        case TileSource::e5m2: return instance.template operator()<TileSource::e5m2>();
      }
      throw Error("decode attention: unknown tile source");
    });
  });
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
  /// Most dynamic shared memory a CTA may have on this device.
  size_t max_shared() {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (max_shared_ == 0) {
      int device = 0, most = 0;
      check(cudaGetDevice(&device), "cudaGetDevice");
      check(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "cudaDeviceGetAttribute");
      max_shared_ = static_cast<size_t>(most);
    }
    return max_shared_;
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
  int ctas_per_sm(void (*kernel)(DecodeArgs), int warps, size_t shared) {
    const auto most = static_cast<int>(max_shared());  // before the lock: it takes it too
    const std::lock_guard<std::mutex> lock(mutex_);
    const void* key = reinterpret_cast<const void*>(kernel);
    if (!limit_set_.count(key)) {
      check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, most), "cudaFuncSetAttribute");
      limit_set_[key] = true;
    }
    const auto at = std::make_pair(key, shared);
    const auto it = occupancy_.find(at);
    if (it != occupancy_.end()) return it->second;
    int n = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, warps * 32, shared),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    if (n == 0)
      throw Error("decode attention: a CTA needs " + std::to_string(shared) +
                  " bytes of shared memory, more than an SM of this GPU holds (fewer stages or warps would fit)");
    occupancy_[at] = n;
    return n;
  }

 private:
  struct PairHash {
    size_t operator()(const std::pair<const void*, size_t>& p) const {
      return std::hash<const void*>()(p.first) ^ (std::hash<size_t>()(p.second) * 0x9E3779B97F4A7C15ull);
    }
  };
  std::mutex mutex_;
  int sms_ = 0;
  size_t max_shared_ = 0;
  std::unordered_map<const void*, bool> limit_set_;
  std::unordered_map<std::pair<const void*, size_t>, int, PairHash> occupancy_;
};

/// Dynamic shared memory of a CTA of `k` taking up to `blocks` blocks.
size_t shared_bytes(const PagedGeometry& geo, const KernelChoice& k, int blocks) {
  return detail::shared_memory_layout(geo.tile_channels(), geo.halves(), k.heads, k.source, k.warps, k.stages,
                                      k.tile_stride, blocks)
      .total;
}

/// The most blocks (up to kMaxBlocksPerSplit; 0 if not even one fits) a CTA of `k` may take: its blocks'
/// entries are staged in shared memory, so a CTA of many blocks can need more than an SM holds (long splits
/// of a large batch of heads of 256 channels, whose CTAs of 16 warps stage two tiles a warp).
int most_blocks_fitting(const PagedGeometry& geo, const KernelChoice& k) {
  const size_t most = KernelFacts::get().max_shared();
  int fits = 0, over = detail::kMaxBlocksPerSplit + 1;  // shared_bytes grows with the blocks
  while (over - fits > 1) {
    const int mid = fits + (over - fits) / 2;
    (shared_bytes(geo, k, mid) <= most ? fits : over) = mid;
  }
  return fits;
}

void check_config(const CacheMemory& cache, const DecodeConfig& config) {
  const PagedGeometry& geo = cache.geometry();
  if (config.q_heads <= 0 || config.q_heads % geo.kv_heads != 0 || config.q_heads / geo.kv_heads > 16)
    throw Error("decode attention: q_heads must be a multiple of the KV heads, at most 16 per KV head (got " +
                std::to_string(config.q_heads) + " for " + std::to_string(geo.kv_heads) + ")");
  if (config.blocks_per_split < 0 || config.plan_tokens < 0 || config.stages < 0 || config.warps < 0)
    throw Error("decode attention: blocks_per_split, plan_tokens, stages and warps must be 0 (chosen) or positive");
  if (config.heads_per_cta != 0 && config.heads_per_cta != 8)
    throw Error("decode attention: heads_per_cta must be 0 (all of a KV head's query heads) or 8 (got " +
                std::to_string(config.heads_per_cta) + ")");
  if (config.work == Work::no_decode && !cache.compressed())
    throw Error("decode attention: the no_decode variant needs a compressed cache");
  if (is_fp8(cache.element_format()) && config.work != Work::full)
    throw Error("decode attention: over an FP8 cache only the full work variant exists");
}

/// Attended blocks of the batch's longest sequence in layers of sliding window `window`, or of a
/// sequence of `plan_tokens` tokens when that is more.
int longest_attended(const BatchTable& batch, int window, int plan_tokens) {
  int longest = 1;
  for (int s = 0; s < batch.sequences(); ++s) longest = std::max(longest, batch.attended_blocks(s, window));
  if (plan_tokens > 0) {
    const int first = first_attended(plan_tokens - 1, window) / kTileTokens;
    longest = std::max(longest, (plan_tokens + kTileTokens - 1) / kTileTokens - first);
  }
  return longest;
}

/// The split of `longest` blocks of each of `sequences` sequences: one wave of CTAs over the whole GPU,
/// shared equally among the (sequence, KV head) pairs, at least one block for each warp or pair of warps,
/// at most what a CTA's shared memory stages the entries of (a config's blocks_per_split, when set, wins,
/// or is refused when it does not fit).
DecodeSplit split_for(const PagedGeometry& geo, const KernelChoice& k, const DecodeConfig& config, int sequences,
                      int longest, int window) {
  const int slices = head_slices(config.q_heads / geo.kv_heads, config);
  KernelFacts& facts = KernelFacts::get();
  // A CTA takes no more blocks than the SM's shared memory stages entries for: more splits instead. The
  // occupancy is asked of splits that fit (the query refuses the others).
  const int fitting = most_blocks_fitting(geo, k);
  const auto occupancy = [&](int blocks) {
    return facts.ctas_per_sm(k.kernel, k.warps, shared_bytes(geo, k, std::clamp(blocks, 1, std::max(fitting, 1))));
  };
  DecodeSplit split;
  split.window = window;
  split.planned_blocks = longest;
  if (config.blocks_per_split > 0) {
    split.blocks_per_split = config.blocks_per_split;
  } else {
    // The occupancy is taken at a typical split, then at the chosen one.
    const int pairs = sequences * geo.kv_heads * slices;  // CTAs that each take a split of a sequence
    const auto blocks_for = [&](int per_sm) {
      const int splits = std::max(1, facts.sms() * per_sm / pairs);
      // At least a block for every unit that takes blocks: a warp, or a pair of warps for heads of two tiles.
      return std::max((longest + splits - 1) / splits, k.warps / geo.halves());
    };
    split.blocks_per_split = std::min(blocks_for(occupancy(128)), detail::kMaxBlocksPerSplit);
    split.blocks_per_split = std::min(blocks_for(occupancy(split.blocks_per_split)), detail::kMaxBlocksPerSplit);
  }
  split.blocks_per_split = std::clamp(split.blocks_per_split, 1, detail::kMaxBlocksPerSplit);
  if (fitting < split.blocks_per_split) {
    if (config.blocks_per_split > 0)
      throw Error("decode attention: blocks_per_split " + std::to_string(config.blocks_per_split) + " needs " +
                  std::to_string(shared_bytes(geo, k, config.blocks_per_split)) +
                  " bytes of shared memory a CTA; at most " + std::to_string(fitting) + " blocks fit on this GPU");
    split.blocks_per_split = std::max(fitting, 1);  // none fitting: the occupancy query below says why
  }
  split.max_splits = (longest + split.blocks_per_split - 1) / split.blocks_per_split;
  if (split.max_splits > detail::kMaxSplits) {
    split.blocks_per_split = (longest + detail::kMaxSplits - 1) / detail::kMaxSplits;
    split.max_splits = (longest + split.blocks_per_split - 1) / split.blocks_per_split;
  }
  if (split.blocks_per_split > std::max(fitting, 1))
    throw Error("decode attention: context too long (" + std::to_string(longest) + " blocks need more than " +
                std::to_string(detail::kMaxSplits) + " splits of at most " + std::to_string(std::max(fitting, 1)) +
                " blocks)");
  // One merge level up to 48 splits (one CTA reads them all); beyond, groups of about sqrt(splits).
  split.merge_group = split.max_splits <= 48
                          ? std::max(split.max_splits, 1)
                          : static_cast<int>(std::ceil(std::sqrt(static_cast<double>(split.max_splits))));
  split.max_groups = (split.max_splits + split.merge_group - 1) / split.merge_group;
  split.shared_bytes = shared_bytes(geo, k, split.blocks_per_split);
  split.ctas_per_sm = occupancy(split.blocks_per_split);
  split.warps = k.warps;
  split.stages = k.stages;
  return split;
}

bool same_layout(const PagedGeometry& a, const PagedGeometry& b) {
  return a.layers == b.layers && a.kv_heads == b.kv_heads && a.head_dim == b.head_dim && a.unit_bytes == b.unit_bytes &&
         a.row_capacity == b.row_capacity && a.element_format == b.element_format;
}

}  // namespace

/// What a plan holds: the kernel, the splits, and the workspace with its capacities.
struct DecodePlan::State {
  DecodeConfig config;
  PagedGeometry geometry;
  std::vector<int32_t> windows;
  bool compressed = false;
  TileSource source = TileSource::gaac;
  int sequences = 0;
  KernelChoice kernel;
  std::vector<DecodeSplit> splits;  ///< one per distinct window
  std::vector<int> layer_split;     ///< per layer: its index in splits
  // Workspace: partial results of (sequence, KV head) pairs × splits × heads of a group × head_dim.
  size_t pairs = 0, split_capacity = 0, group_capacity = 0, heads = 0, slices = 1;
  DeviceBuffer partial_o, partial_ml, group_o, group_ml, counters;
};

DecodePlan::DecodePlan() = default;
DecodePlan::~DecodePlan() = default;
DecodePlan::DecodePlan(DecodePlan&&) noexcept = default;
DecodePlan& DecodePlan::operator=(DecodePlan&&) noexcept = default;

void DecodePlan::plan(const CacheMemory& cache, const BatchTable& batch, const DecodeConfig& config) {
  check_config(cache, config);
  if (!state_) state_ = std::make_unique<State>();
  State& s = *state_;
  const PagedGeometry& geo = cache.geometry();
  s.config = config;
  s.geometry = geo;
  s.windows = cache.windows();
  s.compressed = cache.compressed();
  s.source = detail::tile_source(geo.element_format, s.compressed);
  s.sequences = batch.sequences();
  s.kernel = pick(geo, s.source, config.q_heads / geo.kv_heads, config);
  if (config.stages == 0 && s.kernel.stages > 1 &&
      shared_bytes(geo, s.kernel, 2 * s.kernel.warps) > KernelFacts::get().max_shared()) {
    DecodeConfig one = config;  // units too large for two stages of every warp: one, the same arithmetic
    one.stages = 1;
    one.warps = s.kernel.warps;
    s.kernel = pick(geo, s.source, config.q_heads / geo.kv_heads, one);
  }
  s.splits.clear();
  s.layer_split.assign(static_cast<size_t>(geo.layers), 0);
  for (int l = 0; l < geo.layers; ++l) {
    const int window = cache.window(l);
    auto it = std::find_if(s.splits.begin(), s.splits.end(), [&](const DecodeSplit& d) { return d.window == window; });
    if (it == s.splits.end()) {
      s.splits.push_back(split_for(geo, s.kernel, config, s.sequences, longest_attended(batch, window, config.plan_tokens),
                                   window));
      it = s.splits.end() - 1;
    }
    s.layer_split[static_cast<size_t>(l)] = static_cast<int>(it - s.splits.begin());
  }

  // The workspace grows to the largest need and is kept: a later plan for fewer splits reuses it.
  size_t splits = 0, groups = 0;
  for (const DecodeSplit& d : s.splits) {
    splits = std::max(splits, static_cast<size_t>(d.max_splits));
    groups = std::max(groups, static_cast<size_t>(d.max_groups));
  }
  const size_t pairs = static_cast<size_t>(s.sequences) * geo.kv_heads;
  const size_t heads = static_cast<size_t>(config.q_heads / geo.kv_heads) * geo.head_dim;  // floats per partial
  const size_t slices = static_cast<size_t>(head_slices(config.q_heads / geo.kv_heads, config));
  if (pairs > s.pairs || splits > s.split_capacity || groups > s.group_capacity || heads > s.heads ||
      slices > s.slices) {
    s.pairs = std::max(pairs, s.pairs);
    s.slices = std::max(slices, s.slices);
    s.split_capacity = std::max(splits, s.split_capacity);
    s.group_capacity = std::max(groups, s.group_capacity);
    s.heads = std::max(heads, s.heads);
    const size_t rows = s.heads / static_cast<size_t>(geo.head_dim);  // query heads per partial
    s.partial_o = DeviceBuffer(s.pairs * s.split_capacity * s.heads * 4);
    s.partial_ml = DeviceBuffer(s.pairs * s.split_capacity * rows * 2 * 4);
    s.group_o = DeviceBuffer(s.pairs * s.group_capacity * s.heads * 4);
    s.group_ml = DeviceBuffer(s.pairs * s.group_capacity * rows * 2 * 4);
    s.counters = DeviceBuffer(s.pairs * s.slices * (s.group_capacity + 1) * 4);
    check(cudaMemset(s.counters.data(), 0, s.counters.bytes()), "cudaMemset");
  }
}

bool DecodePlan::planned() const { return state_ != nullptr; }

const DecodeConfig& DecodePlan::config() const {
  if (!state_) throw Error("DecodePlan: not planned yet");
  return state_->config;
}

const DecodeSplit& DecodePlan::split(int layer) const {
  if (!state_) throw Error("DecodePlan: not planned yet");
  if (layer < 0 || layer >= state_->geometry.layers) throw Error("DecodePlan: layer " + std::to_string(layer) + " out of range");
  return state_->splits[static_cast<size_t>(state_->layer_split[static_cast<size_t>(layer)])];
}

size_t DecodePlan::workspace_bytes() const {
  if (!state_) return 0;
  const State& s = *state_;
  return s.partial_o.bytes() + s.partial_ml.bytes() + s.group_o.bytes() + s.group_ml.bytes() + s.counters.bytes();
}

bool DecodePlan::covers(const CacheMemory& cache, const BatchTable& batch) const {
  if (!state_) return false;
  const State& s = *state_;
  if (!same_layout(s.geometry, cache.geometry()) || s.compressed != cache.compressed() || s.windows != cache.windows() ||
      batch.sequences() > s.sequences)
    return false;
  for (const DecodeSplit& d : s.splits) {
    for (int q = 0; q < batch.sequences(); ++q) {
      if (batch.attended_blocks(q, d.window) > d.planned_blocks) return false;
    }
  }
  return true;
}

void DecodePlan::run(const CacheMemory& cache, const BatchTable& batch, int layer, const uint16_t* q, uint16_t* out,
                     float scale, Stream stream) const {
  const DecodeSplit& d = split(layer);  // throws when not planned or the layer is out of range
  if (!covers(cache, batch))
    throw Error("decode attention: the plan does not cover this cache and batch (another cache, more sequences, or "
                "longer ones than planned): plan again");
  const State& s = *state_;
  const PagedGeometry& geo = s.geometry;
  DecodeArgs a;
  a.cache = cache.view();
  a.batch = batch.view();
  a.layer = layer;
  a.window = cache.window(layer);
  a.q = q;
  a.out = out;
  a.q_heads = s.config.q_heads;
  a.group = s.config.q_heads / geo.kv_heads;
  a.head_slices = head_slices(a.group, s.config);
  const float softmax_scale = scale > 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(geo.head_dim));
  // An FP8 cache's layer scales: K's joins the softmax scale (one product, as engines descale), V's the
  // output's 1/S; 1 for a BF16 cache, which leaves its arithmetic as it was.
  a.scale_log2 = softmax_scale * cache.scale(layer, TensorKind::key) * 1.4426950408889634f;
  a.out_scale = cache.scale(layer, TensorKind::value);
  a.blocks_per_split = d.blocks_per_split;
  a.max_splits = static_cast<int>(s.split_capacity);  // strides of the workspace; the grid has d.max_splits
  a.merge_group = d.merge_group;
  a.max_groups = static_cast<int>(s.group_capacity);
  a.partial_o = static_cast<float*>(s.partial_o.data());
  a.partial_ml = static_cast<float*>(s.partial_ml.data());
  a.group_o = static_cast<float*>(s.group_o.data());
  a.group_ml = static_cast<float*>(s.group_ml.data());
  a.counters = static_cast<uint32_t*>(s.counters.data());
  a.tile_stride = s.kernel.tile_stride;
  a.sink_magic = s.config.work == Work::full ? 0u : 0x9E3779B9u;
  // A programmatic dependent launch (sm_90): the kernel's CTAs may start while the previous kernel in the
  // stream drains, and wait in the kernel until it has completed (decode_kernel.cuh).
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t launch{};
  launch.gridDim = dim3(static_cast<unsigned>(d.max_splits), static_cast<unsigned>(geo.kv_heads * a.head_slices),
                        static_cast<unsigned>(batch.sequences()));
  launch.blockDim = dim3(static_cast<unsigned>(s.kernel.warps * 32));
  launch.dynamicSmemBytes = d.shared_bytes;
  launch.stream = stream;
  launch.attrs = &overlap;
  launch.numAttrs = 1;
  check(cudaLaunchKernelEx(&launch, s.kernel.kernel, a), "decode attention launch");
}

}  // namespace gaac::cuda
