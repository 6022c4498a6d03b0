// A paged cache's memory on the device: copied from a host cache, carved from a budget on the device
// alone, or made as the BF16 target of decompress-first.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/check.hpp"
#include "cuda/lane_bases.hpp"
#include "cuda/lane_fp8.cuh"
#include "gaac/bf16.hpp"
#include "gaac/cuda.hpp"
#include "gaac/fp8_dump.hpp"
#include "gaac/kv_cache.hpp"

namespace gaac::cuda {
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

/// The bases and their lane form on the device, for a compressed cache.
void upload_bases(const PagedGeometry& geo, const uint8_t* bases, DeviceBuffer& plain, DeviceBuffer& lanes) {
  plain = DeviceBuffer(geo.bases_bytes());
  plain.upload(bases, geo.bases_bytes());
  std::vector<uint32_t> lane_bases(detail::lane_bases_index(geo, geo.layers, 0));
  detail::fill_lane_bases(geo, bases, lane_bases.data());
  lanes = DeviceBuffer(lane_bases.size() * 4);
  lanes.upload(lane_bases.data(), lane_bases.size() * 4);
}

/// Throws gaac::Error unless the cache holds BF16 elements: caches grown on the device are BF16.
void require_bf16_geometry(const PagedGeometry& geo) {
  if (geo.element_format != ElementFormat::bf16) {
    throw Error(std::string("CacheMemory: a cache grown on the GPU holds BF16 tiles, not ") + to_string(geo.element_format) +
                " (an FP8 cache is made on the host and uploaded)");
  }
}

/// True when one of the 16·C codes at `codes` is a NaN or an infinity of format F.
template <ElementFormat F>
bool has_special_code(const std::vector<uint8_t>& codes) {
  for (size_t i = 0; i < codes.size(); i += 4) {
    uint32_t word;
    std::memcpy(&word, codes.data() + i, 4);
    if (lane::fp8_special_codes<F>(word) != 0u) return true;
  }
  return false;
}

/// DeviceCacheView::special of an FP8 host cache whose pool's first `units` units are uploaded: every
/// tile (compressed slots decoded with the cache's codecs, raw tiles read) is looked at once.
std::vector<uint32_t> special_units(const KvCache& host, uint32_t units) {
  const PagedCacheView v = host.view();
  const PagedGeometry& g = v.geometry;
  const int channels = g.tile_channels();
  std::vector<uint32_t> bits(units / 32 + 1, 0u);
  std::vector<uint8_t> codes(static_cast<size_t>(kTileTokens) * channels);
  const auto special = g.element_format == ElementFormat::e4m3 ? &has_special_code<ElementFormat::e4m3>
                                                               : &has_special_code<ElementFormat::e5m2>;
  for (int layer = 0; layer < g.layers; ++layer)
    for (uint32_t row = 0; row < g.row_capacity; ++row)
      for (int head = 0; head < g.kv_heads; ++head)
        for (const TensorKind kind : {TensorKind::key, TensorKind::value})
          for (int half = 0; half < g.halves(); ++half) {
            const uint32_t e = v.entries[g.entry_index(layer, row, head, kind, half)];
            const TileClass cls = entry_class(e);
            if (cls != TileClass::compressed && cls != TileClass::raw) continue;
            const uint32_t unit = entry_unit(e);
            const uint8_t* first = v.units + g.unit_offset(unit);
            if (cls == TileClass::compressed) {
              const BlockDecodeResult r = host.fp8_codecs()->codec(kind, layer, head, half).decode_blocks(
                  first, g.unit_bytes, 1, codes.data(), static_cast<size_t>(channels), codes.size());
              if (r.status != DecodeStatus::ok) throw Error("CacheMemory: an FP8 slot of the host cache does not decode");
            } else {
              uint32_t second = 0;
              if (g.raw_split()) std::memcpy(&second, first + g.partner_offset(), sizeof second);
              const uint8_t* high = g.raw_split() ? v.units + g.unit_offset(second) : first + g.raw_half_bytes();
              std::memcpy(codes.data(), first, g.raw_half_bytes());
              std::memcpy(codes.data() + g.raw_half_bytes(), high, g.raw_half_bytes());
            }
            if (special(codes)) bits[unit / 32] |= 1u << (unit % 32);
          }
  return bits;
}

}  // namespace

CacheMemory CacheMemory::upload(const KvCache& host_cache) {
  const PagedCacheView host = host_cache.view();
  const PagedGeometry& geo = host.geometry;
  if (geo.unit_bytes % 16 != 0) throw Error("CacheMemory: unit size is not a multiple of 16 bytes");
  const uint32_t units = units_in_use(host);
  CacheMemory cache;
  cache.units_ = units;
  const size_t pool = static_cast<size_t>(units) * geo.unit_bytes;
  cache.units_buffer_ = DeviceBuffer(pool + kPoolPadding);
  cache.units_buffer_.upload(host.units, pool);
  check(cudaMemset(static_cast<char*>(cache.units_buffer_.data()) + pool, 0, kPoolPadding), "cudaMemset");
  cache.entries_buffer_ = DeviceBuffer(geo.table_entries() * 4);
  cache.entries_buffer_.upload(host.entries, geo.table_entries() * 4);
  if (host.bases) upload_bases(geo, host.bases, cache.bases_buffer_, cache.lane_bases_buffer_);
  cache.windows_.assign(static_cast<size_t>(geo.layers), 0);
  if (host.windows) std::copy(host.windows, host.windows + geo.layers, cache.windows_.begin());
  std::vector<uint32_t> free_units;  // the host's free units the device pool holds, bottom first
  for (const uint32_t unit : host_cache.free_units()) {
    if (unit < units) free_units.push_back(unit);
  }
  cache.finish(geo, free_units);
  std::vector<uint32_t> refs(std::max<uint32_t>(units, 1), 0);  // each tile's first unit, once per entry
  for (size_t i = 0; i < geo.table_entries(); ++i)
    if (entry_class(host.entries[i]) != TileClass::absent) ++refs[entry_unit(host.entries[i])];
  cache.refs_buffer_.upload(refs.data(), static_cast<size_t>(units) * 4);
  if (is_fp8(geo.element_format)) {
    for (int l = 0; l < geo.layers; ++l) {
      cache.k_scales_.push_back(host_cache.scale(l, TensorKind::key));
      cache.v_scales_.push_back(host_cache.scale(l, TensorKind::value));
    }
    const std::vector<uint32_t> special = special_units(host_cache, units);
    cache.special_buffer_ = DeviceBuffer(special.size() * 4);
    cache.special_buffer_.upload(special.data(), special.size() * 4);
    std::vector<uint16_t> table(256);  // each code's exact value, as CPU attention widens it
    for (size_t x = 0; x < table.size(); ++x) table[x] = float_to_bf16(fp8_to_float(static_cast<uint8_t>(x), geo.element_format));
    cache.widening_buffer_ = DeviceBuffer(table.size() * 2);
    cache.widening_buffer_.upload(table.data(), table.size() * 2);
    cache.view_.special = static_cast<const uint32_t*>(cache.special_buffer_.data());
    cache.view_.widening = static_cast<const uint16_t*>(cache.widening_buffer_.data());
  }
  return cache;
}

void CacheMemory::require_bf16(const char* what) const {
  if (is_fp8(element_format()))
    throw Error(std::string(what) + ": the cache holds " + to_string(element_format()) +
                " codes; on the GPU an FP8 cache is read by decode attention only");
}

float CacheMemory::scale(int layer, TensorKind kind) const {
  if (layer < 0 || layer >= view_.geometry.layers) throw Error("CacheMemory::scale: layer " + std::to_string(layer) + " out of range");
  const std::vector<float>& scales = kind == TensorKind::key ? k_scales_ : v_scales_;
  return scales.empty() ? 1.0f : scales[static_cast<size_t>(layer)];
}

CacheMemory CacheMemory::create(const CacheConfig& config) {
  const CacheCarving carving = carve_cache(config);
  const PagedGeometry& geo = carving.geometry;
  require_bf16_geometry(geo);
  CacheMemory cache;
  cache.units_ = static_cast<uint32_t>(carving.units);
  const size_t pool = static_cast<size_t>(cache.units_) * geo.unit_bytes;
  cache.units_buffer_ = DeviceBuffer(pool + kPoolPadding);
  check(cudaMemset(cache.units_buffer_.data(), 0, pool + kPoolPadding), "cudaMemset");
  cache.entries_buffer_ = DeviceBuffer(geo.table_entries() * 4);
  // 0x80 in every byte: the absent class, unit 0x0080'8080 (never read for an absent tile).
  check(cudaMemset(cache.entries_buffer_.data(), 0x80, geo.table_entries() * 4), "cudaMemset");
  if (!carving.bases.empty()) upload_bases(geo, carving.bases.data(), cache.bases_buffer_, cache.lane_bases_buffer_);
  cache.windows_ = carving.windows;
  std::vector<uint32_t> stack(cache.units_);  // every unit free, unit 0 on top (popped first)
  for (uint32_t i = 0; i < cache.units_; ++i) stack[i] = cache.units_ - 1 - i;
  cache.finish(geo, stack);
  return cache;
}

CacheMemory CacheMemory::bf16_for(const PagedGeometry& like, int window) {
  PagedGeometry geo = like;
  geo.layers = 1;
  geo.unit_bytes = static_cast<uint32_t>(geo.raw_tile_bytes());
  const size_t entries = geo.table_entries();
  if (entries > kMaxUnits) throw Error("CacheMemory::bf16_for: too many entries for one unit each");
  CacheMemory cache;
  cache.units_ = static_cast<uint32_t>(entries);
  cache.units_buffer_ = DeviceBuffer(entries * geo.unit_bytes + kPoolPadding);
  cache.entries_buffer_ = DeviceBuffer(entries * 4);
  check(cudaMemset(cache.entries_buffer_.data(), 0xFF, entries * 4), "cudaMemset");  // invalid until written
  cache.windows_ = {window};
  cache.finish(geo, {});
  return cache;
}

void CacheMemory::finish(const PagedGeometry& geo, const std::vector<uint32_t>& free_units) {
  windows_buffer_ = DeviceBuffer(windows_.size() * 4);
  windows_buffer_.upload(windows_.data(), windows_.size() * 4);
  free_stack_buffer_ = DeviceBuffer(std::max<size_t>(units_, 1) * 4);  // room for every unit
  refs_buffer_ = DeviceBuffer(std::max<size_t>(units_, 1) * 4);
  check(cudaMemset(refs_buffer_.data(), 0, refs_buffer_.bytes()), "cudaMemset");
  free_stack_buffer_.upload(free_units.data(), free_units.size() * 4);
  const auto free_count = static_cast<uint32_t>(free_units.size());
  free_count_buffer_ = DeviceBuffer(4);
  free_count_buffer_.upload(&free_count, 4);
  status_buffer_ = DeviceBuffer(4);
  check(cudaMemset(status_buffer_.data(), 0, 4), "cudaMemset");
  view_.geometry = geo;
  view_.units = static_cast<uint8_t*>(units_buffer_.data());
  view_.entries = static_cast<uint32_t*>(entries_buffer_.data());
  view_.bases = static_cast<const uint8_t*>(bases_buffer_.data());
  view_.lane_bases = static_cast<const uint32_t*>(lane_bases_buffer_.data());
  view_.windows = static_cast<const int32_t*>(windows_buffer_.data());
  view_.free_stack = static_cast<uint32_t*>(free_stack_buffer_.data());
  view_.free_count = static_cast<uint32_t*>(free_count_buffer_.data());
  view_.status = static_cast<uint32_t*>(status_buffer_.data());
  view_.refs = static_cast<uint32_t*>(refs_buffer_.data());
}

CacheMemory CacheMemory::clone() const {
  CacheMemory copy;
  copy.windows_ = windows_;
  copy.units_ = units_;
  copy.rows_taken_ = rows_taken_;
  copy.units_buffer_ = units_buffer_.copy();
  copy.entries_buffer_ = entries_buffer_.copy();
  copy.bases_buffer_ = bases_buffer_.copy();
  copy.lane_bases_buffer_ = lane_bases_buffer_.copy();
  copy.windows_buffer_ = windows_buffer_.copy();
  copy.free_stack_buffer_ = free_stack_buffer_.copy();
  copy.free_count_buffer_ = free_count_buffer_.copy();
  copy.status_buffer_ = status_buffer_.copy();
  copy.refs_buffer_ = refs_buffer_.copy();
  copy.k_scales_ = k_scales_;
  copy.v_scales_ = v_scales_;
  copy.special_buffer_ = special_buffer_.copy();
  copy.widening_buffer_ = widening_buffer_.copy();
  copy.view_ = view_;
  copy.view_.units = static_cast<uint8_t*>(copy.units_buffer_.data());
  copy.view_.entries = static_cast<uint32_t*>(copy.entries_buffer_.data());
  copy.view_.bases = static_cast<const uint8_t*>(copy.bases_buffer_.data());
  copy.view_.lane_bases = static_cast<const uint32_t*>(copy.lane_bases_buffer_.data());
  copy.view_.windows = static_cast<const int32_t*>(copy.windows_buffer_.data());
  copy.view_.free_stack = static_cast<uint32_t*>(copy.free_stack_buffer_.data());
  copy.view_.free_count = static_cast<uint32_t*>(copy.free_count_buffer_.data());
  copy.view_.status = static_cast<uint32_t*>(copy.status_buffer_.data());
  copy.view_.refs = static_cast<uint32_t*>(copy.refs_buffer_.data());
  if (view_.special) copy.view_.special = static_cast<const uint32_t*>(copy.special_buffer_.data());
  if (view_.widening) copy.view_.widening = static_cast<const uint16_t*>(copy.widening_buffer_.data());
  return copy;
}

uint32_t CacheMemory::free_unit_count() const {
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // kernels on any stream
  uint32_t count = 0;
  free_count_buffer_.download(&count, 4);
  return count;
}

uint32_t CacheMemory::status() const {
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  uint32_t word = 0;
  status_buffer_.download(&word, 4);
  return word;
}

uint32_t CacheMemory::take_rows(uint32_t count) {
  const uint32_t capacity = view_.geometry.row_capacity;
  if (count > capacity - rows_taken_)
    throw Error(ErrorCode::out_of_space, "the block table has " + std::to_string(capacity - rows_taken_) +
                                             " free rows, " + std::to_string(count) +
                                             " asked for (a larger budget has more)");
  const uint32_t first = rows_taken_;
  rows_taken_ += count;
  return first;
}

CacheMemory::TileCounts CacheMemory::count_tiles() const {
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

std::vector<uint32_t> CacheMemory::free_units() const {
  const uint32_t count = free_unit_count();
  if (count > units_) throw Error("CacheMemory: the device free stack holds more units than the pool");
  std::vector<uint32_t> units(count);
  free_stack_buffer_.download(units.data(), static_cast<size_t>(count) * 4);
  return units;
}

std::vector<uint32_t> CacheMemory::entries() const {
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::vector<uint32_t> entries(view_.geometry.table_entries());
  entries_buffer_.download(entries.data(), entries.size() * 4);
  return entries;
}

std::vector<uint32_t> CacheMemory::refs() const {
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::vector<uint32_t> refs(units_);
  refs_buffer_.download(refs.data(), refs.size() * 4);
  return refs;
}

void CacheMemory::download(std::vector<uint8_t>& units, std::vector<uint32_t>& entries) const {
  const PagedGeometry& geo = view_.geometry;
  units.resize(static_cast<size_t>(units_) * geo.unit_bytes);
  entries.resize(geo.table_entries());
  units_buffer_.download(units.data(), units.size());
  entries_buffer_.download(entries.data(), entries.size() * 4);
}

}  // namespace gaac::cuda
