// Device memory for the paged cache and the sequence tables: plain cudaMalloc allocations and copies.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/check.hpp"
#include "cuda/lane_bases.hpp"
#include "gaac/cuda.hpp"
#include "gaac/error.hpp"
#include "cache/layout.hpp"
#include "gaac/kv_cache.hpp"

namespace gaac::cuda {

bool device_available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return false;
  }
  return count > 0;
}

std::string device_description() {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  return std::string(prop.name) + ", " + std::to_string(prop.multiProcessorCount) + " SMs, compute capability " +
         std::to_string(prop.major) + "." + std::to_string(prop.minor);
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) check(cudaMalloc(&data_, bytes), "cudaMalloc of " + std::to_string(bytes) + " bytes");
}

DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept : data_(other.data_), bytes_(other.bytes_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) cudaFree(data_);
    data_ = other.data_;
    bytes_ = other.bytes_;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::upload(const void* src, size_t bytes, size_t offset) {
  if (offset + bytes > bytes_) throw Error("DeviceBuffer::upload past the end of the allocation");
  if (bytes > 0) check(cudaMemcpy(static_cast<char*>(data_) + offset, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
}

void DeviceBuffer::download(void* dst, size_t bytes, size_t offset) const {
  if (offset + bytes > bytes_) throw Error("DeviceBuffer::download past the end of the allocation");
  if (bytes > 0)
    check(cudaMemcpy(dst, static_cast<const char*>(data_) + offset, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}

namespace {

constexpr size_t kPoolPadding = 16;  // kernels read up to 8 bytes past a slot's escapes


/// Units from 0 up to the last one a tile of the table holds (for a raw tile in two units, its second
/// one too): the part of the pool worth copying.
uint32_t units_in_use(const PagedCacheView& host) {
  const PagedGeometry& geo = host.geometry;
  uint32_t end = 0;
  for (size_t i = 0; i < geo.table_entries(); ++i) {
    const uint32_t e = host.entries[i];
    if (entry_class(e) == TileClass::absent) continue;
    const uint32_t unit = entry_unit(e);
    end = std::max(end, unit + 1);
    if (entry_class(e) == TileClass::raw && geo.raw_split()) {
      uint32_t second = 0;
      std::memcpy(&second, host.units + geo.unit_offset(unit) + geo.partner_offset(), sizeof second);
      end = std::max(end, second + 1);
    }
  }
  return end;
}

}  // namespace

DeviceCache DeviceCache::upload(const KvCache& host_cache) {
  const PagedCacheView host = host_cache.view();
  const PagedGeometry& geo = host.geometry;
  if (geo.unit_bytes % 16 != 0) throw Error("DeviceCache: unit size is not a multiple of 16 bytes");
  const uint32_t units = units_in_use(host);
  DeviceCache cache;
  cache.units_ = units;
  const size_t pool = static_cast<size_t>(units) * geo.unit_bytes;
  cache.units_buffer_ = DeviceBuffer(pool + kPoolPadding);
  cache.units_buffer_.upload(host.units, pool);
  check(cudaMemset(static_cast<char*>(cache.units_buffer_.data()) + pool, 0, kPoolPadding), "cudaMemset");
  cache.entries_buffer_ = DeviceBuffer(geo.table_entries() * 4);
  cache.entries_buffer_.upload(host.entries, geo.table_entries() * 4);
  if (host.bases) {
    cache.bases_buffer_ = DeviceBuffer(geo.bases_bytes());
    cache.bases_buffer_.upload(host.bases, geo.bases_bytes());
    std::vector<uint32_t> lane_bases(detail::lane_bases_index(geo, geo.layers, 0));
    detail::fill_lane_bases(geo, host.bases, lane_bases.data());
    cache.lane_bases_buffer_ = DeviceBuffer(lane_bases.size() * 4);
    cache.lane_bases_buffer_.upload(lane_bases.data(), lane_bases.size() * 4);
  }
  cache.windows_.assign(static_cast<size_t>(geo.layers), 0);
  if (host.windows) std::copy(host.windows, host.windows + geo.layers, cache.windows_.begin());
  cache.windows_buffer_ = DeviceBuffer(cache.windows_.size() * 4);
  cache.windows_buffer_.upload(cache.windows_.data(), cache.windows_.size() * 4);
  // The free stack: the host's free units the device pool holds, bottom first, room for every unit.
  std::vector<uint32_t> free_units;
  for (const uint32_t unit : host_cache.free_units()) {
    if (unit < units) free_units.push_back(unit);
  }
  cache.finish(geo, free_units);
  return cache;
}

DeviceCache DeviceCache::create(const CacheConfig& config) {
  const CacheGeometry& g = config.geometry;
  cache::check_geometry(g);
  const cache::Layout layout = cache::layout_for(g, config.format, config.calibration);
  const uint64_t units = layout.cache_units(config.budget_bytes, config.format);
  DeviceCache cache;
  PagedGeometry geo{g.layers, g.kv_heads, g.head_dim, layout.unit_bytes, static_cast<uint32_t>(layout.rows_for(units))};
  cache.units_ = static_cast<uint32_t>(units);
  const size_t pool = static_cast<size_t>(units) * geo.unit_bytes;
  cache.units_buffer_ = DeviceBuffer(pool + kPoolPadding);
  check(cudaMemset(cache.units_buffer_.data(), 0, pool + kPoolPadding), "cudaMemset");
  cache.entries_buffer_ = DeviceBuffer(geo.table_entries() * 4);
  // 0x80 in every byte: the absent class, unit 0x0080'8080 (never read for an absent tile).
  check(cudaMemset(cache.entries_buffer_.data(), 0x80, geo.table_entries() * 4), "cudaMemset");
  if (config.format == CacheFormat::gaac) {
    std::vector<uint8_t> bases(geo.bases_bytes());
    cache::fill_bases(*config.calibration, geo, bases.data());
    cache.bases_buffer_ = DeviceBuffer(bases.size());
    cache.bases_buffer_.upload(bases.data(), bases.size());
    std::vector<uint32_t> lane_bases(detail::lane_bases_index(geo, geo.layers, 0));
    detail::fill_lane_bases(geo, bases.data(), lane_bases.data());
    cache.lane_bases_buffer_ = DeviceBuffer(lane_bases.size() * 4);
    cache.lane_bases_buffer_.upload(lane_bases.data(), lane_bases.size() * 4);
  }
  cache.windows_.assign(static_cast<size_t>(g.layers), 0);
  for (size_t l = 0; l < g.sliding_window.size() && l < cache.windows_.size(); ++l) cache.windows_[l] = g.sliding_window[l];
  cache.windows_buffer_ = DeviceBuffer(cache.windows_.size() * 4);
  cache.windows_buffer_.upload(cache.windows_.data(), cache.windows_.size() * 4);
  // Every unit free, unit 0 on top (popped first).
  std::vector<uint32_t> stack(cache.units_);
  for (uint32_t i = 0; i < cache.units_; ++i) stack[i] = cache.units_ - 1 - i;
  cache.finish(geo, stack);
  return cache;
}

void DeviceCache::finish(const PagedGeometry& geo, const std::vector<uint32_t>& free_units) {
  free_stack_buffer_ = DeviceBuffer(std::max<size_t>(units_, 1) * 4);  // room for every unit
  free_stack_buffer_.upload(free_units.data(), free_units.size() * 4);
  const auto free_count = static_cast<uint32_t>(free_units.size());
  free_count_buffer_ = DeviceBuffer(4);
  free_count_buffer_.upload(&free_count, 4);
  status_buffer_ = DeviceBuffer(4);
  check(cudaMemset(status_buffer_.data(), 0, 4), "cudaMemset");
  view_ = {geo, static_cast<const uint8_t*>(units_buffer_.data()), static_cast<const uint32_t*>(entries_buffer_.data()),
           static_cast<const uint8_t*>(bases_buffer_.data()), static_cast<const int32_t*>(windows_buffer_.data())};
}

uint32_t DeviceCache::free_unit_count() const {
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // kernels on any stream
  uint32_t count = 0;
  if (free_count_buffer_.bytes() > 0) free_count_buffer_.download(&count, 4);
  return count;
}

uint32_t DeviceCache::status() const {
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  uint32_t word = 0;
  if (status_buffer_.bytes() > 0) status_buffer_.download(&word, 4);
  return word;
}

uint32_t DeviceCache::take_rows(uint32_t count) {
  const uint32_t capacity = view_.geometry.row_capacity;
  if (count > capacity - rows_taken_)
    throw Error("DeviceCache: the block table has " + std::to_string(capacity - rows_taken_) + " free rows, " +
                std::to_string(count) + " asked for (a larger budget has more)");
  const uint32_t first = rows_taken_;
  rows_taken_ += count;
  return first;
}

DeviceCache::TileCounts DeviceCache::count_tiles() const {
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::vector<uint32_t> entries(view_.geometry.table_entries());
  entries_buffer_.download(entries.data(), entries.size() * 4);
  TileCounts counts;
  for (const uint32_t e : entries) {
    switch (entry_class(e)) {
      case TileClass::compressed: ++counts.compressed; break;
      case TileClass::raw: ++counts.raw; break;
      default: ++counts.absent; break;
    }
  }
  return counts;
}

std::vector<uint32_t> DeviceCache::free_units() const {
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  uint32_t count = 0;
  if (free_count_buffer_.bytes() == 0) return {};
  free_count_buffer_.download(&count, 4);
  if (count > units_) throw Error("DeviceCache: the device free stack holds more units than the pool");
  std::vector<uint32_t> units(count);
  free_stack_buffer_.download(units.data(), static_cast<size_t>(count) * 4);
  return units;
}

DeviceCache DeviceCache::bf16_for(const PagedGeometry& like, int window) {
  PagedGeometry geo = like;
  geo.layers = 1;
  geo.unit_bytes = static_cast<uint32_t>(geo.raw_tile_bytes());
  const size_t entries = geo.table_entries();
  if (entries > kMaxUnits) throw Error("DeviceCache::bf16_for: too many entries for one unit each");
  DeviceCache cache;
  cache.units_ = static_cast<uint32_t>(entries);
  cache.units_buffer_ = DeviceBuffer(entries * geo.unit_bytes + kPoolPadding);
  cache.entries_buffer_ = DeviceBuffer(entries * 4);
  check(cudaMemset(cache.entries_buffer_.data(), 0xFF, entries * 4), "cudaMemset");  // invalid until written
  cache.windows_ = {window};
  cache.windows_buffer_ = DeviceBuffer(4);
  cache.windows_buffer_.upload(cache.windows_.data(), 4);
  cache.view_ = {geo, static_cast<const uint8_t*>(cache.units_buffer_.data()),
                 static_cast<const uint32_t*>(cache.entries_buffer_.data()), nullptr,
                 static_cast<const int32_t*>(cache.windows_buffer_.data())};
  return cache;
}

void DeviceCache::download(std::vector<uint8_t>& units, std::vector<uint32_t>& entries) const {
  const PagedGeometry& geo = view_.geometry;
  units.resize(static_cast<size_t>(units_) * geo.unit_bytes);
  entries.resize(geo.table_entries());
  units_buffer_.download(units.data(), units.size());
  entries_buffer_.download(entries.data(), entries.size() * 4);
}

DeviceSequences DeviceSequences::upload(const SequenceTableView& host) {
  DeviceSequences seqs;
  const int n = host.sequences;
  if (n < 1) throw Error("DeviceSequences: a batch needs at least one sequence");
  seqs.lengths_.assign(host.lengths, host.lengths + n);
  seqs.blocks_.resize(static_cast<size_t>(n));
  for (int s = 0; s < n; ++s) {
    seqs.blocks_[static_cast<size_t>(s)] = host.indptr[s + 1] - host.indptr[s];
    if (seqs.blocks_[static_cast<size_t>(s)] * kTileTokens < host.lengths[s] || host.lengths[s] < 0)
      throw Error("DeviceSequences: sequence " + std::to_string(s) + " has fewer blocks than its length needs");
  }
  seqs.total_blocks_ = host.indptr[n];
  seqs.indptr_ = DeviceBuffer(static_cast<size_t>(n + 1) * 4);
  seqs.indptr_.upload(host.indptr, static_cast<size_t>(n + 1) * 4);
  seqs.rows_ = DeviceBuffer(static_cast<size_t>(std::max(seqs.total_blocks_, 1)) * 4);
  seqs.rows_.upload(host.rows, static_cast<size_t>(seqs.total_blocks_) * 4);
  seqs.lengths_buffer_ = DeviceBuffer(static_cast<size_t>(n) * 4);
  seqs.lengths_buffer_.upload(host.lengths, static_cast<size_t>(n) * 4);
  seqs.view_ = {n, static_cast<const int32_t*>(seqs.indptr_.data()), static_cast<const uint32_t*>(seqs.rows_.data()),
                static_cast<const int32_t*>(seqs.lengths_buffer_.data())};
  return seqs;
}

DeviceSequences DeviceSequences::reserve(DeviceCache& cache, int sequences, int max_tokens) {
  if (sequences < 1) throw Error("DeviceSequences: a batch needs at least one sequence");
  if (max_tokens < 1) throw Error("DeviceSequences: max_tokens must be at least 1");
  const int blocks = (max_tokens + kTileTokens - 1) / kTileTokens;
  const uint32_t first = cache.take_rows(static_cast<uint32_t>(sequences) * static_cast<uint32_t>(blocks));
  std::vector<int32_t> indptr(static_cast<size_t>(sequences) + 1);
  std::vector<uint32_t> rows(static_cast<size_t>(sequences) * blocks);
  for (int s = 0; s <= sequences; ++s) indptr[static_cast<size_t>(s)] = s * blocks;
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = first + static_cast<uint32_t>(i);
  std::vector<int32_t> lengths(static_cast<size_t>(sequences), 0);
  DeviceSequences seqs = upload({sequences, indptr.data(), rows.data(), lengths.data()});
  seqs.scratch_rows_ = DeviceBuffer((rows.size() + static_cast<size_t>(sequences)) * 4);  // count/16 + 1 per sequence
  return seqs;
}

void DeviceSequences::note_begin(int count) {
  if (count < 1) throw Error("begin_tokens: count must be at least 1");
  for (int s = 0; s < sequences(); ++s) {
    if (length(s) + count > capacity(s))
      throw Error("begin_tokens: sequence " + std::to_string(s) + " holds " + std::to_string(length(s)) +
                  " tokens and has room for " + std::to_string(capacity(s)) + "; " + std::to_string(count) +
                  " more do not fit");
  }
  for (int32_t& len : lengths_) len += count;
  last_count_ = count;
}

int DeviceSequences::attended_blocks(int s, int window) const {
  const int len = length(s);
  if (len <= 0) return 0;
  const int first = first_attended(len - 1, window) / kTileTokens;
  return std::min(blocks(s), (len + kTileTokens - 1) / kTileTokens) - first;
}

DecodeWorkspace::DecodeWorkspace(int sequences, int kv_heads, int group, int head_dim, int max_splits, int max_groups)
    : sequences_(sequences), kv_heads_(kv_heads), group_(group), head_dim_(head_dim), max_splits_(max_splits),
      max_groups_(max_groups) {
  const size_t pairs = static_cast<size_t>(sequences) * kv_heads;
  partial_o_ = DeviceBuffer(pairs * max_splits * group * head_dim * 4);
  partial_ml_ = DeviceBuffer(pairs * max_splits * group * 2 * 4);
  group_o_ = DeviceBuffer(pairs * max_groups * group * head_dim * 4);
  group_ml_ = DeviceBuffer(pairs * max_groups * group * 2 * 4);
  counters_ = DeviceBuffer(pairs * (max_groups + 1) * 4);
  check(cudaMemset(counters_.data(), 0, counters_.bytes()), "cudaMemset");
}

bool DecodeWorkspace::fits(int sequences, int kv_heads, int group, int head_dim, int max_splits, int max_groups) const {
  return sequences <= sequences_ && kv_heads == kv_heads_ && group <= group_ && head_dim <= head_dim_ &&
         max_splits <= max_splits_ && max_groups <= max_groups_;
}

}  // namespace gaac::cuda
