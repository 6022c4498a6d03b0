#include "cuda/paged_fill.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>

#include "gaac/codec.hpp"
#include "gaac/error.hpp"

namespace gaac::cuda {

PagedCacheView HostPagedCache::view() const {
  return {geometry, units.data(), entries.data(), bases.empty() ? nullptr : bases.data(), windows.data()};
}

SequenceTableView HostSequenceTable::view() const {
  return {static_cast<int>(lengths.size()), indptr.data(), rows.data(), lengths.data()};
}

CalibrationTable calibration_of_layer(const CalibrationTable& table, int layer) {
  CalibrationTable one(1, table.kv_heads(), table.head_dim());
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    for (int h = 0; h < table.kv_heads(); ++h) {
      std::ranges::copy(table.b3(kind, layer, h), one.b3(kind, 0, h).begin());
      std::ranges::copy(table.b4(kind, layer, h), one.b4(kind, 0, h).begin());
    }
    one.set_escape_capacity(kind, 0, table.escape_capacity(kind, layer));
  }
  one.metadata() = table.metadata();
  return one;
}

namespace {

/// One tile to store: where its 16 rows come from and how it is held.
struct PendingTile {
  size_t entry;            // index in the block table
  const uint16_t* source;  // token 0, channel 0 of the tile in its dump
  int tokens;              // rows present (16 for a complete block)
  TensorKind kind;
  int layer, head, half;
};

}  // namespace

HostPagedCache fill_paged_cache(std::span<const KvDump* const> sequences, const FillOptions& options,
                                HostSequenceTable& table) {
  if (sequences.empty()) throw Error("fill_paged_cache: no sequences");
  const KvDump& first = *sequences.front();
  validate_dump(first);
  const int layers = static_cast<int>(first.layers.size());
  const int kv = first.kv_heads(), hd = first.head_dim();
  for (const KvDump* d : sequences) {
    validate_dump(*d);
    if (static_cast<int>(d->layers.size()) != layers || d->kv_heads() != kv || d->head_dim() != hd)
      throw Error("fill_paged_cache: every sequence needs the same layers, KV heads and head width");
    for (const KvLayer& l : d->layers)
      if (l.k.tokens != d->layers.front().k.tokens)
        throw Error("fill_paged_cache: every layer of a sequence needs the same token count");
  }
  const bool compressed = options.format == FillFormat::gaac;
  if (compressed) {
    if (!options.calibration) throw Error("fill_paged_cache: a GAAC cache needs a calibration table");
    const CalibrationTable& c = *options.calibration;
    if (c.layers() != layers || c.kv_heads() != kv || c.head_dim() != hd)
      throw Error("fill_paged_cache: the calibration table does not match the dumps");
  }

  HostPagedCache cache;
  PagedGeometry& geo = cache.geometry;
  geo.layers = layers;
  geo.kv_heads = kv;
  geo.head_dim = hd;
  const int channels = geo.tile_channels(), halves = geo.halves();
  const TileShape key_shape{TensorKind::key, channels};
  size_t capacity = 0;
  if (compressed) {
    if (options.escape_capacity_set || options.escape_capacity > 0) {
      capacity = options.escape_capacity;
    } else {
      for (int l = 0; l < layers; ++l)
        for (const TensorKind kind : {TensorKind::key, TensorKind::value})
          capacity = std::max(capacity, options.calibration->escape_capacity(kind, l));
    }
    if (capacity % kSlotAlignment != 0 || capacity > key_shape.max_slot_capacity())
      throw Error("fill_paged_cache: escape capacity " + std::to_string(capacity) + " is not a valid slot capacity");
    geo.unit_bytes = static_cast<uint32_t>(key_shape.slot_bytes(capacity));
  } else {
    geo.unit_bytes = static_cast<uint32_t>(geo.raw_tile_bytes());
  }

  // Block rows, in sequence order.
  table.indptr.assign(1, 0);
  table.rows.clear();
  table.lengths.clear();
  for (const KvDump* d : sequences) {
    const int tokens = d->layers.front().k.tokens;
    const int blocks = (tokens + kTileTokens - 1) / kTileTokens;
    for (int b = 0; b < blocks; ++b) table.rows.push_back(static_cast<uint32_t>(table.rows.size()));
    table.indptr.push_back(static_cast<int32_t>(table.rows.size()));
    table.lengths.push_back(tokens);
  }
  geo.row_capacity = std::max<uint32_t>(1, static_cast<uint32_t>(table.rows.size()));
  cache.entries.assign(geo.table_entries(), kAbsentEntry);
  cache.windows.assign(static_cast<size_t>(layers), 0);
  for (size_t l = 0; l < options.windows.size() && l < cache.windows.size(); ++l) cache.windows[l] = options.windows[l];

  // Every tile held, in storage order.
  std::vector<PendingTile> pending;
  for (size_t s = 0; s < sequences.size(); ++s) {
    const KvDump& d = *sequences[s];
    const int tokens = table.lengths[s];
    for (int l = 0; l < layers; ++l) {
      const int window = cache.windows[static_cast<size_t>(l)];
      const int first_kept = tokens > 0 ? first_attended(tokens - 1, window) / kTileTokens : 0;
      for (int b = table.indptr[s]; b < table.indptr[s + 1]; ++b) {
        const int block = b - table.indptr[s];
        const int rows = std::min(kTileTokens, tokens - block * kTileTokens);
        for (int head = 0; head < kv; ++head)
          for (const TensorKind kind : {TensorKind::key, TensorKind::value})
            for (int half = 0; half < halves; ++half) {
              const size_t entry = geo.entry_index(l, table.rows[static_cast<size_t>(b)], head, kind, half);
              if (block < first_kept) {
                ++cache.counts.absent_tiles;
                continue;
              }
              const KvTensor& t = kind == TensorKind::key ? d.layers[static_cast<size_t>(l)].k : d.layers[static_cast<size_t>(l)].v;
              const uint16_t* src = t.data.data() + (static_cast<size_t>(block) * kTileTokens * kv + head) * hd + half * channels;
              pending.push_back({entry, src, rows, kind, l, head, half});
            }
      }
    }
  }

  // Encode; count units: one per slot or BF16 raw tile, two per raw tile of a compressed cache.
  const size_t row_stride = static_cast<size_t>(kv) * hd;
  const size_t slot_bytes = geo.unit_bytes;
  std::vector<std::vector<uint8_t>> slots(pending.size());
  std::vector<uint8_t> is_slot(pending.size(), 0);
  uint32_t needed = 0;
  for (size_t i = 0; i < pending.size(); ++i) {
    const PendingTile& p = pending[i];
    if (compressed && p.tokens == kTileTokens) {
      const TileShape shape{p.kind, channels};
      slots[i].assign(slot_bytes, 0);
      const TileEncoding enc = encode_tile(shape, p.source, row_stride,
                                           options.calibration->tile_bases(p.kind, p.layer, p.head, p.half), capacity,
                                           slots[i]);
      if (enc.fits) {
        is_slot[i] = 1;
        ++cache.counts.compressed_tiles;
        cache.counts.exactly_full_slots += enc.escape_bytes == capacity ? 1 : 0;
        needed += 1;
        continue;
      }
      slots[i].clear();
    }
    if (p.tokens == kTileTokens) ++cache.counts.raw_tiles;
    else ++cache.counts.tail_tiles;
    needed += geo.raw_split() ? 2 : 1;
  }
  if (needed >= kMaxUnits) throw Error("fill_paged_cache: more units than a block-table entry can index");
  cache.unit_count = needed;
  std::vector<uint32_t> order(needed);
  std::iota(order.begin(), order.end(), 0u);
  if (options.shuffle_seed != 0) std::shuffle(order.begin(), order.end(), std::mt19937_64(options.shuffle_seed));
  cache.units.assign(static_cast<size_t>(needed) * slot_bytes, 0);

  uint32_t next = 0;
  const size_t row_bytes = static_cast<size_t>(channels) * 2;
  const auto copy_rows = [&](uint8_t* dst, const PendingTile& p, int from, int count) {
    for (int r = 0; r < count; ++r) {
      const int token = from + r;
      if (token >= p.tokens) break;  // rows past the tail's tokens stay zero
      std::memcpy(dst + r * row_bytes, p.source + static_cast<size_t>(token) * row_stride, row_bytes);
    }
  };
  for (size_t i = 0; i < pending.size(); ++i) {
    const PendingTile& p = pending[i];
    const uint32_t a = order[next++];
    uint8_t* unit_a = cache.units.data() + static_cast<size_t>(a) * slot_bytes;
    if (is_slot[i]) {
      std::memcpy(unit_a, slots[i].data(), slot_bytes);
      cache.entries[p.entry] = make_entry(TileClass::compressed, a);
    } else if (geo.raw_split()) {
      const uint32_t b = order[next++];
      uint8_t* unit_b = cache.units.data() + static_cast<size_t>(b) * slot_bytes;
      copy_rows(unit_a, p, 0, kTileTokens / 2);
      std::memcpy(unit_a + geo.partner_offset(), &b, 4);
      copy_rows(unit_b, p, kTileTokens / 2, kTileTokens / 2);
      cache.entries[p.entry] = make_entry(TileClass::raw, a);
    } else {
      copy_rows(unit_a, p, 0, kTileTokens);
      cache.entries[p.entry] = make_entry(TileClass::raw, a);
    }
  }

  if (compressed) {
    const CalibrationTable& c = *options.calibration;
    cache.bases.assign(geo.bases_bytes(), 0);
    for (int l = 0; l < layers; ++l)
      for (const TensorKind kind : {TensorKind::key, TensorKind::value})
        for (int h = 0; h < kv; ++h) {
          std::ranges::copy(c.b3(kind, l, h), cache.bases.begin() + static_cast<std::ptrdiff_t>(geo.bases_index(l, kind, 0, h)));
          std::ranges::copy(c.b4(kind, l, h), cache.bases.begin() + static_cast<std::ptrdiff_t>(geo.bases_index(l, kind, 1, h)));
        }
  }
  return cache;
}

}  // namespace gaac::cuda
