// Editing a reserved batch on the device between forwards (docs/format.md, section 13): select (forks
// share complete blocks' tiles through per-unit reference counts, copy their open block; unnamed
// sequences are freed) and truncate (blocks past the new length released; a block cut inside made a
// BF16 tail again, bit for bit, from a staged decode of its tiles). The host measures and checks
// first, so an edit that does not fit changes nothing; then every kernel runs on the default stream and
// the call waits for them. Kernels that pop units from the free stack never push in the same launch.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cuda/check.hpp"
#include "cuda/unit_pool.cuh"
#include "gaac/cuda.hpp"
#include "gaac/error.hpp"

namespace gaac::cuda {
namespace {

using detail::blocks_for;
using detail::raw_units;

constexpr int kThreads = 128;

/// A fork: the sequence whose rows start at `from` (of `length` tokens) copied into the rows at `to`.
struct ForkJob {
  uint32_t from = 0, to = 0;
  int32_t length = 0;
};

/// `blocks` consecutive block rows from `first` whose tiles are let go (entries absent).
struct FreeJob {
  uint32_t first = 0;
  int32_t blocks = 0;
};

/// A block cut inside: its row, and the tokens it keeps (1..15).
struct CutJob {
  uint32_t row = 0;
  int32_t open = 0;
};

/// The entries of (layer, row).
__device__ uint32_t* row_entries(const DeviceCacheView& c, int layer, uint32_t row) {
  return c.entries + c.geometry.entry_index(layer, row, 0, TensorKind::key, 0);
}

/// Thread 0: slot[t] = rank of tile t among the tiles of `entries` that `pick` chooses (−1 for the
/// others); returns how many it chose.
template <class Pick>
__device__ int rank_tiles(int tiles, int* slot, Pick pick) {
  int n = 0;
  for (int t = 0; t < tiles; ++t) slot[t] = pick(t) ? n++ : -1;
  return n;
}

/// Copies 16-byte word `i` of unit `from` to unit `to`.
__device__ void copy_unit_word(const DeviceCacheView& c, uint32_t from, uint32_t to, int i) {
  reinterpret_cast<uint4*>(c.units + c.geometry.unit_offset(to))[i] =
      reinterpret_cast<const uint4*>(c.units + c.geometry.unit_offset(from))[i];
}

/// One CTA per (fork, layer): the complete blocks' entries copied, their tiles' references grown; the
/// open block's raw tiles copied into units popped from the free stack.
__global__ void __launch_bounds__(kThreads) fork_kernel(const DeviceCacheView c, const ForkJob* jobs) {
  extern __shared__ int slot[];  // per tile of the open block: its rank among the raw ones
  __shared__ uint32_t first_unit;
  const ForkJob job = jobs[blockIdx.x];
  const int layer = static_cast<int>(blockIdx.y), tid = static_cast<int>(threadIdx.x);
  const PagedGeometry& geo = c.geometry;
  const int tiles = geo.entries_per_layer_row(), per_tile = raw_units(geo);
  const int complete = job.length / kTileTokens;
  for (int i = tid; i < complete * tiles; i += kThreads) {
    const uint32_t e = row_entries(c, layer, job.from + static_cast<uint32_t>(i / tiles))[i % tiles];
    if (entry_class(e) != TileClass::absent) atomicAdd(&c.refs[entry_unit(e)], 1u);
    row_entries(c, layer, job.to + static_cast<uint32_t>(i / tiles))[i % tiles] = e;
  }
  if (job.length % kTileTokens == 0) return;
  const uint32_t* src = row_entries(c, layer, job.from + static_cast<uint32_t>(complete));
  uint32_t* dst = row_entries(c, layer, job.to + static_cast<uint32_t>(complete));
  if (tid == 0) {
    const int n = rank_tiles(tiles, slot, [&](int t) { return entry_class(src[t]) == TileClass::raw; });
    first_unit = n > 0 ? detail::pop_units(c, static_cast<uint32_t>(n * per_tile)) : 0;
  }
  __syncthreads();
  for (int t = tid; t < tiles; t += kThreads) {
    if (slot[t] >= 0) continue;
    const uint32_t e = src[t];  // never compressed in an open block; shared if it were (slots are never written)
    if (entry_class(e) == TileClass::compressed) atomicAdd(&c.refs[entry_unit(e)], 1u);
    dst[t] = entry_class(e) == TileClass::compressed ? e : kAbsentEntry;
  }
  const uint32_t* popped = c.free_stack + first_unit;
  const int words = static_cast<int>(geo.unit_bytes / 16);
  if (first_unit == kNoRow) {  // too few free units (the host checked; a concurrent user may not have)
    for (int t = tid; t < tiles; t += kThreads)
      if (slot[t] >= 0) dst[t] = kAbsentEntry;
    return;
  }
  for (int i = tid; i < tiles * per_tile * words; i += kThreads) {
    const int t = i / (per_tile * words), k = i / words % per_tile;
    if (slot[t] < 0) continue;
    const uint32_t from = k == 0 ? entry_unit(src[t]) : detail::partner_of(c, entry_unit(src[t]));
    copy_unit_word(c, from, popped[slot[t] * per_tile + k], i % words);
  }
  __syncthreads();
  for (int t = tid; t < tiles; t += kThreads) {
    if (slot[t] < 0) continue;
    const uint32_t unit = popped[slot[t] * per_tile];
    if (per_tile == 2) *reinterpret_cast<uint32_t*>(c.units + geo.unit_offset(unit) + geo.partner_offset()) = popped[slot[t] * 2 + 1];
    c.refs[unit] = 1;
    dst[t] = make_entry(TileClass::raw, unit);
  }
}

/// One CTA per (job, layer): every tile of the job's rows let go, entries absent.
__global__ void __launch_bounds__(kThreads) free_kernel(const DeviceCacheView c, const FreeJob* jobs) {
  const FreeJob job = jobs[blockIdx.x];
  const int layer = static_cast<int>(blockIdx.y);
  const int tiles = c.geometry.entries_per_layer_row();
  for (int i = static_cast<int>(threadIdx.x); i < job.blocks * tiles; i += kThreads) {
    uint32_t& e = row_entries(c, layer, job.first + static_cast<uint32_t>(i / tiles))[i % tiles];
    if (entry_class(e) == TileClass::absent) continue;
    detail::release_tile(c, e);
    e = kAbsentEntry;
  }
}

/// One CTA per (cut, layer): what cutting its tiles takes. counts[0] += units of the raw tiles to take
/// (a compressed tile, or a tile another entry shares); counts[1] += slots that free (a compressed tile
/// no other entry holds).
__global__ void __launch_bounds__(kThreads) measure_cuts_kernel(const DeviceCacheView c, const CutJob* jobs,
                                                                 unsigned long long* counts) {
  const int layer = static_cast<int>(blockIdx.y);
  const uint32_t* entries = row_entries(c, layer, jobs[blockIdx.x].row);
  const auto per_tile = static_cast<unsigned long long>(raw_units(c.geometry));
  for (int t = static_cast<int>(threadIdx.x); t < c.geometry.entries_per_layer_row(); t += kThreads) {
    const uint32_t e = entries[t];
    if (entry_class(e) == TileClass::absent) continue;
    const bool shared = c.refs[entry_unit(e)] > 1;
    if (entry_class(e) == TileClass::compressed || shared) atomicAdd(&counts[0], per_tile);
    if (entry_class(e) == TileClass::compressed && !shared) atomicAdd(&counts[1], 1ull);
  }
}

/// What happens to a cut tile.
enum CutFate : uint8_t { kKeep = 0, kFresh = 1, kInPlace = 2 };

/// One CTA per (cut, layer): each tile's hold dropped. A raw tile whose last holder this cut is stays
/// where it is (kInPlace); any other tile gets a raw tile of its own (kFresh), its old units pushed
/// when no entry holds them any longer.
__global__ void __launch_bounds__(kThreads) cut_kernel(const DeviceCacheView c, const CutJob* jobs, uint8_t* fates) {
  const int layer = static_cast<int>(blockIdx.y), layers = static_cast<int>(gridDim.y);
  const int tiles = c.geometry.entries_per_layer_row();
  const uint32_t* entries = row_entries(c, layer, jobs[blockIdx.x].row);
  uint8_t* fate = fates + (static_cast<size_t>(blockIdx.x) * layers + layer) * tiles;
  for (int t = static_cast<int>(threadIdx.x); t < tiles; t += kThreads) {
    const uint32_t e = entries[t];
    if (entry_class(e) == TileClass::absent) {
      fate[t] = kKeep;
      continue;
    }
    const uint32_t unit = entry_unit(e);
    const uint32_t before = atomicSub(&c.refs[unit], 1u);
    if (entry_class(e) == TileClass::raw && before == 1) {
      c.refs[unit] = 1;  // no other holder is left to race with
      fate[t] = kInPlace;
      continue;
    }
    if (before == 1) detail::push_unit(c, unit);  // a compressed slot no one else holds
    fate[t] = kFresh;
  }
}

/// What retail_kernel reads: the staged rows of every cut tile, `[layers][cuts][16][kv_heads][head_dim]`
/// per kind.
struct RetailArgs {
  DeviceCacheView cache;
  const CutJob* jobs = nullptr;
  const uint8_t* fates = nullptr;
  const uint16_t* staged_k = nullptr;
  const uint16_t* staged_v = nullptr;
  int cuts = 0;
};

/// One CTA per (cut, layer): the cut block's tiles made BF16 tails holding its first `open` tokens, the
/// later rows zero: fresh tiles popped, zeroed and filled from the staged rows; kept raw tiles' later
/// rows zeroed.
__global__ void __launch_bounds__(kThreads) retail_kernel(const RetailArgs a) {
  extern __shared__ int slot[];
  __shared__ uint32_t first_unit;
  const DeviceCacheView& c = a.cache;
  const PagedGeometry& geo = c.geometry;
  const int cut = static_cast<int>(blockIdx.x), layer = static_cast<int>(blockIdx.y), layers = static_cast<int>(gridDim.y);
  const int tid = static_cast<int>(threadIdx.x);
  const int tiles = geo.entries_per_layer_row(), per_tile = raw_units(geo), channels = geo.tile_channels();
  const CutJob job = a.jobs[cut];
  uint32_t* entries = row_entries(c, layer, job.row);
  const uint8_t* fate = a.fates + (static_cast<size_t>(cut) * layers + layer) * tiles;
  if (tid == 0) {
    const int n = rank_tiles(tiles, slot, [&](int t) { return fate[t] == kFresh; });
    first_unit = n > 0 ? detail::pop_units(c, static_cast<uint32_t>(n * per_tile)) : 0;
  }
  __syncthreads();
  const uint32_t* popped = c.free_stack + first_unit;
  const int words = static_cast<int>(geo.unit_bytes / 16);
  if (first_unit != kNoRow) {
    for (int i = tid; i < tiles * per_tile * words; i += kThreads) {
      const int t = i / (per_tile * words);
      if (slot[t] < 0) continue;
      const uint32_t unit = popped[slot[t] * per_tile + i / words % per_tile];
      reinterpret_cast<uint4*>(c.units + geo.unit_offset(unit))[i % words] = make_uint4(0, 0, 0, 0);
    }
  }
  __syncthreads();
  for (int t = tid; t < tiles; t += kThreads) {
    if (slot[t] < 0) continue;
    if (first_unit == kNoRow) {  // too few free units (the host checked; a concurrent user may not have)
      entries[t] = kAbsentEntry;
      continue;
    }
    const uint32_t unit = popped[slot[t] * per_tile];
    if (per_tile == 2) *reinterpret_cast<uint32_t*>(c.units + geo.unit_offset(unit) + geo.partner_offset()) = popped[slot[t] * 2 + 1];
    c.refs[unit] = 1;
    entries[t] = make_entry(TileClass::raw, unit);
  }
  __syncthreads();
  // Rows, 16 bytes a thread: tile t = (head, kind, half) in entry order.
  const int pieces = channels / 8;
  const size_t token_stride = static_cast<size_t>(geo.kv_heads) * geo.head_dim;
  for (int i = tid; i < tiles * kTileTokens * pieces; i += kThreads) {
    const int t = i / (kTileTokens * pieces), token = i / pieces % kTileTokens, piece = i % pieces;
    if (fate[t] == kKeep || (fate[t] == kFresh && first_unit == kNoRow)) continue;
    if (fate[t] == kInPlace && token < job.open) continue;
    const int half = t % geo.halves(), kind = t / geo.halves() % 2, head = t / geo.halves() / 2;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (token < job.open) {
      const uint16_t* staged = (kind == 0 ? a.staged_k : a.staged_v) +
                               ((static_cast<size_t>(layer) * a.cuts + cut) * kTileTokens + token) * token_stride +
                               static_cast<size_t>(head) * geo.head_dim + half * channels + piece * 8;
      value = *reinterpret_cast<const uint4*>(staged);
    }
    reinterpret_cast<uint4*>(detail::raw_row(c, entry_unit(entries[t]), token))[piece] = value;
  }
}

/// A device copy of `items`.
template <class T>
DeviceBuffer upload_all(const std::vector<T>& items) {
  DeviceBuffer buffer(std::max<size_t>(items.size(), 1) * sizeof(T));
  buffer.upload(items.data(), items.size() * sizeof(T));
  return buffer;
}

void check_reserved(int reserved_blocks, const char* what) {
  if (reserved_blocks == 0) throw Error(std::string(what) + ": needs a batch made by BatchTable::reserve");
}

void check_complete(const CacheMemory& cache, const char* what) {
  if (cache.status() & CacheMemory::kOutOfUnits)
    throw Error(ErrorCode::out_of_space, std::string(what) + ": the cache ran out of units earlier, so its contents "
                                                             "are incomplete (a larger budget holds more)");
}

/// Launches free_kernel over `jobs` (nothing for none).
void free_rows(CacheMemory& cache, const std::vector<FreeJob>& jobs) {
  if (jobs.empty()) return;
  const DeviceBuffer d = upload_all(jobs);
  free_kernel<<<dim3(static_cast<unsigned>(jobs.size()), static_cast<unsigned>(cache.geometry().layers)), kThreads>>>(
      cache.view(), static_cast<const FreeJob*>(d.data()));
  check(cudaGetLastError(), "free_kernel launch");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // before `d` goes
}

}  // namespace

void BatchTable::select(CacheMemory& cache, std::span<const int> sources) {
  cache.require_bf16("select");
  check_reserved(reserved_blocks_, "select");
  const int n = sequences();
  if (sources.empty()) throw Error("select: a batch keeps at least one sequence");
  for (const int s : sources)
    if (s < 0 || s >= n)
      throw Error("select: sequence " + std::to_string(s) + " out of range for a batch of " + std::to_string(n));
  check_complete(cache, "select");  // synchronises the device: work on every stream is done
  const PagedGeometry& geo = cache.geometry();
  // The sequences no one names are let go first, so a fork may take their block rows.
  std::vector<bool> used(static_cast<size_t>(n), false);
  for (const int s : sources) used[static_cast<size_t>(s)] = true;
  std::vector<uint32_t> released;
  for (int s = 0; s < n; ++s)
    if (!used[static_cast<size_t>(s)]) released.push_back(first_rows_[static_cast<size_t>(s)]);
  std::vector<bool> placed(static_cast<size_t>(n), false);
  std::vector<uint32_t> first_rows, taken;
  std::vector<int32_t> lengths, held;
  std::vector<ForkJob> forks;
  size_t spare_used = 0, released_used = 0;
  uint64_t need = 0;
  const auto give_back = [&] { spare_.insert(spare_.end(), taken.begin(), taken.end()); };
  try {
    for (const int s : sources) {
      const auto i = static_cast<size_t>(s);
      lengths.push_back(lengths_[i]);
      held.push_back(held_.empty() ? 0 : held_[i]);
      if (!placed[i]) {
        placed[i] = true;
        first_rows.push_back(first_rows_[i]);
        continue;
      }
      uint32_t range = 0;
      if (spare_used < spare_.size()) {
        range = spare_[spare_used++];
      } else if (released_used < released.size()) {
        range = released[released_used++];
      } else {
        range = cache.take_rows(static_cast<uint32_t>(reserved_blocks_));
        taken.push_back(range);
      }
      forks.push_back({first_rows_[i], range, lengths_[i]});
      first_rows.push_back(range);
      if (lengths_[i] % kTileTokens != 0) need += geo.entries_per_row() * static_cast<uint64_t>(geo.raw_split() ? 2 : 1);
    }
  } catch (const Error& e) {
    give_back();
    throw Error(ErrorCode::out_of_space, std::string("select: no block rows for another fork; the cache is unchanged: ") +
                                             e.what());
  }
  const uint32_t free = cache.free_unit_count();
  if (need > free) {
    give_back();
    throw Error(ErrorCode::out_of_space, "select: the forks' open blocks need " + std::to_string(need) +
                                             " free units and " + std::to_string(free) +
                                             " are free; the cache is unchanged (a larger budget holds more)");
  }
  // Commit: the sequences no one named let go (their rows emptied, their references dropped; every source keeps
  // its own), then the forks take references into their rows.
  std::vector<FreeJob> frees;
  for (int s = 0; s < n; ++s) {
    if (used[static_cast<size_t>(s)]) continue;
    frees.push_back({first_rows_[static_cast<size_t>(s)], blocks_for(lengths_[static_cast<size_t>(s)])});
  }
  free_rows(cache, frees);
  if (!forks.empty()) {
    const DeviceBuffer d = upload_all(forks);
    const auto shared = static_cast<size_t>(geo.entries_per_layer_row()) * sizeof(int);
    fork_kernel<<<dim3(static_cast<unsigned>(forks.size()), static_cast<unsigned>(geo.layers)), kThreads, shared>>>(
        cache.view(), static_cast<const ForkJob*>(d.data()));
    check(cudaGetLastError(), "fork_kernel launch");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  spare_.erase(spare_.begin(), spare_.begin() + static_cast<std::ptrdiff_t>(spare_used));
  spare_.insert(spare_.end(), released.begin() + static_cast<std::ptrdiff_t>(released_used), released.end());
  first_rows_ = std::move(first_rows);
  lay_out(lengths, held);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

void BatchTable::truncate(CacheMemory& cache, std::span<const int> lengths) {
  cache.require_bf16("truncate");
  check_reserved(reserved_blocks_, "truncate");
  const int n = sequences();
  if (lengths.size() != static_cast<size_t>(n))
    throw Error("truncate: " + std::to_string(lengths.size()) + " lengths for " + std::to_string(n) + " sequences");
  bool same = true;
  for (int b = 0; b < n; ++b) {
    const int to = lengths[static_cast<size_t>(b)], len = length(b);
    if (to < 0 || to > len)
      throw Error("truncate: sequence " + std::to_string(b) + " holds " + std::to_string(len) +
                  " tokens, cannot be cut back to " + std::to_string(to));
    same = same && to == len;
    if (to == 0 || to == len) continue;
    for (int l = 0; l < cache.geometry().layers; ++l) {
      const int w = cache.window(l), keep = held(b);
      const int released = w > 0 && keep > 0 ? first_attended(keep - 1, w) / kTileTokens : 0;  // blocks let go
      if (first_attended(to - 1, w) / kTileTokens < released)
        throw Error("truncate: sequence " + std::to_string(b) + " cut back to " + std::to_string(to) +
                    " tokens would attend positions its " + std::to_string(w) +
                    "-token sliding window has already released");
    }
  }
  if (same) return;
  check_complete(cache, "truncate");
  const PagedGeometry& geo = cache.geometry();
  std::vector<FreeJob> releases;
  std::vector<CutJob> cuts;
  for (int b = 0; b < n; ++b) {
    const int to = lengths[static_cast<size_t>(b)], len = length(b);
    if (to == len) continue;
    const int keep = blocks_for(to), old = blocks_for(len);
    if (old > keep) releases.push_back({row_of(b, keep), old - keep});
    if (to % kTileTokens != 0) cuts.push_back({row_of(b, to / kTileTokens), to % kTileTokens});
  }
  DeviceBuffer cut_jobs, staged_k, staged_v;
  if (!cuts.empty()) {
    cut_jobs = upload_all(cuts);
    const dim3 grid(static_cast<unsigned>(cuts.size()), static_cast<unsigned>(geo.layers));
    DeviceBuffer counts(2 * sizeof(unsigned long long));
    check(cudaMemset(counts.data(), 0, counts.bytes()), "cudaMemset");
    measure_cuts_kernel<<<grid, kThreads>>>(cache.view(), static_cast<const CutJob*>(cut_jobs.data()),
                                            static_cast<unsigned long long*>(counts.data()));
    check(cudaGetLastError(), "measure_cuts_kernel launch");
    unsigned long long measured[2] = {0, 0};
    counts.download(measured, sizeof measured);
    const uint32_t free = cache.free_unit_count();
    if (measured[0] > free + measured[1])
      throw Error(ErrorCode::out_of_space, "truncate: the cut blocks need " + std::to_string(measured[0]) +
                                               " free units for their BF16 tails and " + std::to_string(free) +
                                               " are free (and " + std::to_string(measured[1]) +
                                               " slots they free); the cache is unchanged (a larger budget holds more)");
    // Stage the rows each cut block keeps, decoded (or copied) before any of its units moves.
    const size_t per_cut = static_cast<size_t>(kTileTokens) * geo.kv_heads * geo.head_dim;
    staged_k = DeviceBuffer(per_cut * cuts.size() * static_cast<size_t>(geo.layers) * 2);
    staged_v = DeviceBuffer(staged_k.bytes());
    std::vector<int32_t> indptr, opens;
    std::vector<uint32_t> rows;
    for (size_t i = 0; i < cuts.size(); ++i) {
      indptr.push_back(static_cast<int32_t>(i));
      rows.push_back(cuts[i].row);
      opens.push_back(cuts[i].open);
    }
    indptr.push_back(static_cast<int32_t>(cuts.size()));
    const BatchTable staged_table = upload({static_cast<int>(cuts.size()), indptr.data(), rows.data(), opens.data()});
    DenseLayout out;
    out.k = static_cast<uint16_t*>(staged_k.data());
    out.v = static_cast<uint16_t*>(staged_v.data());
    out.head_stride = geo.head_dim;
    out.token_stride = static_cast<int64_t>(geo.kv_heads) * geo.head_dim;
    out.outer_stride = static_cast<int64_t>(per_cut);
    out.layer_stride = static_cast<int64_t>(per_cut * cuts.size());
    decompress_dense(cache, staged_table, 0, geo.layers, out, nullptr);
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  free_rows(cache, releases);
  if (!cuts.empty()) {
    const dim3 grid(static_cast<unsigned>(cuts.size()), static_cast<unsigned>(geo.layers));
    DeviceBuffer fates(cuts.size() * static_cast<size_t>(geo.layers) * geo.entries_per_layer_row());
    const auto* jobs = static_cast<const CutJob*>(cut_jobs.data());
    cut_kernel<<<grid, kThreads>>>(cache.view(), jobs, static_cast<uint8_t*>(fates.data()));
    check(cudaGetLastError(), "cut_kernel launch");
    RetailArgs a;
    a.cache = cache.view();
    a.jobs = jobs;
    a.fates = static_cast<const uint8_t*>(fates.data());
    a.staged_k = static_cast<const uint16_t*>(staged_k.data());
    a.staged_v = static_cast<const uint16_t*>(staged_v.data());
    a.cuts = static_cast<int>(cuts.size());
    retail_kernel<<<grid, kThreads, static_cast<size_t>(geo.entries_per_layer_row()) * sizeof(int)>>>(a);
    check(cudaGetLastError(), "retail_kernel launch");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  std::vector<int32_t> new_lengths(lengths.begin(), lengths.end()), new_held(static_cast<size_t>(n), 0);
  for (int b = 0; b < n; ++b) new_held[static_cast<size_t>(b)] = std::min(held(b), new_lengths[static_cast<size_t>(b)]);
  lay_out(new_lengths, new_held);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

}  // namespace gaac::cuda
