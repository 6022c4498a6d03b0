// Filling a gaac::KvCache for the GPU tests the way an engine does, and counting what it holds.
//
// Every sequence grows by appends of uneven sizes (single decoding tokens, prefill chunks, whole
// blocks), the sequences taking turns, while a decoy sequence that is freed halfway leaves free units
// behind that later tiles take: tiles land in units out of order, as in a pool that has been in use.
#pragma once

#include <algorithm>
#include <cstring>
#include <iterator>
#include <span>
#include <vector>

#include "gaac/error.hpp"
#include "gaac/format.hpp"
#include "gaac/kv_cache.hpp"
#include "gaac/kv_dump.hpp"
#include "gaac/tensor_view.hpp"

namespace gaac::test {

/// Tokens first .. first + tokens − 1 of every layer of `d`.
inline KvDump stretch(const KvDump& d, int first, int tokens) {
  KvDump out;
  for (const KvLayer& l : d.layers) {
    KvLayer part;
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      const KvTensor& src = l.of(kind);
      KvTensor& dst = part.of(kind);
      dst = {tokens, src.kv_heads, src.head_dim, {}};
      const size_t row = static_cast<size_t>(src.kv_heads) * src.head_dim;
      dst.data.assign(src.data.begin() + static_cast<std::ptrdiff_t>(first * row),
                      src.data.begin() + static_cast<std::ptrdiff_t>((first + tokens) * row));
    }
    out.layers.push_back(std::move(part));
  }
  return out;
}

/// A cache's configuration for `dumps` (same layers, heads and width), with a budget that holds them
/// and the decoy whatever their values.
inline CacheConfig cache_config_for(std::span<const KvDump> dumps, CacheFormat format, const CalibrationTable* table,
                                    const std::vector<int>& windows) {
  CacheConfig c;
  const KvDump& first = dumps.front();
  c.geometry = {static_cast<int>(first.layers.size()), first.kv_heads(), first.head_dim(), windows};
  c.format = format;
  c.calibration = table;
  int longest = 1;
  for (const KvDump& d : dumps) longest = std::max(longest, d.layers.front().k.tokens);
  c.budget_bytes = worst_case_budget(c.geometry, format, table, longest, static_cast<int>(dumps.size()) + 1);
  return c;
}

/// Appends each dump to `cache` as a new sequence (see the top of this file) and returns their ids in
/// order. Throws gaac::Error when an append does not fit.
inline std::vector<SequenceId> fill_cache(KvCache& cache, std::span<const KvDump> dumps) {
  constexpr int kSteps[] = {1, 37, 3, 16, 90, 2, 300, 5};
  std::vector<SequenceId> ids;
  std::vector<int> done(dumps.size(), 0);
  int total = 0, longest = 0;
  for (const KvDump& d : dumps) {
    ids.push_back(cache.add_sequence());
    total += d.layers.front().k.tokens;
    longest = std::max(longest, d.layers.front().k.tokens);
  }
  const auto append = [&](SequenceId id, const KvDump& d, int at, int n) {
    std::vector<KvView> k, v;
    for (const KvLayer& l : d.layers) {
      k.push_back(view_of(l.k).tokens_from(at, n));
      v.push_back(view_of(l.v).tokens_from(at, n));
    }
    if (cache.append(id, k, v).status != CacheStatus::ok) throw Error("fill_cache: the cache is full");
  };
  SequenceId decoy = cache.add_sequence();
  bool decoy_alive = true;
  const int decoy_chunk = std::min(16, dumps.front().layers.front().k.tokens);
  int appended = 0;
  for (int round = 0; appended < total; ++round) {
    for (size_t s = 0; s < dumps.size(); ++s) {
      const int tokens = dumps[s].layers.front().k.tokens;
      const int n = std::min(kSteps[(static_cast<size_t>(round) + s) % std::size(kSteps)], tokens - done[s]);
      if (n <= 0) continue;
      append(ids[s], dumps[s], done[s], n);
      done[s] += n;
      appended += n;
    }
    if (decoy_alive && cache.length(decoy) + decoy_chunk <= longest) append(decoy, dumps.front(), 0, decoy_chunk);
    if (decoy_alive && 2 * appended >= total) {
      cache.free_sequence(decoy);
      decoy_alive = false;
    }
  }
  if (decoy_alive) cache.free_sequence(decoy);
  return ids;
}

/// What the rows of a batch hold in one layer.
struct TileCounts {
  uint64_t compressed = 0;    ///< slots
  uint64_t exactly_full = 0;  ///< slots whose escapes fill the capacity to the last byte
  uint64_t raw = 0;           ///< raw tiles (finalized or open)
  uint64_t absent = 0;        ///< released by a sliding window
};

/// Counts the tiles of `layer` in the blocks of `table`.
inline TileCounts count_tiles(const KvCache& cache, const SequenceTable& table, int layer) {
  const PagedCacheView v = cache.view();
  const PagedGeometry& g = v.geometry;
  const TileShape shape{TensorKind::key, g.tile_channels()};
  TileCounts n;
  for (const uint32_t row : table.rows)
    for (int h = 0; h < g.kv_heads; ++h)
      for (const TensorKind kind : {TensorKind::key, TensorKind::value})
        for (int half = 0; half < g.halves(); ++half) {
          const uint32_t e = v.entries[g.entry_index(layer, row, h, kind, half)];
          if (entry_class(e) == TileClass::absent) {
            ++n.absent;
          } else if (entry_class(e) == TileClass::raw) {
            ++n.raw;
          } else {
            ++n.compressed;
            const uint8_t* tags = v.units + g.unit_offset(entry_unit(e)) + shape.tag_offset();
            size_t escapes = 0;
            for (size_t b = 0; b < shape.tag_bytes(); ++b)
              for (int k = 0; k < 4; ++k) {
                const int mode = (tags[b] >> (2 * k)) & 3;
                escapes += mode == 1 ? 1 : mode == 2 ? 5 : 0;
              }
            n.exactly_full += escapes == g.escape_capacity() ? 1 : 0;
          }
        }
  return n;
}

}  // namespace gaac::test
