// KvCache: editing sequences after the fact: truncate (a sequence cut back to a prefix, its cut block
// turned back into a raw tail) and clone (a deep copy of the whole cache).
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "cache/cache_state.hpp"
#include "gaac/kv_cache.hpp"

namespace gaac {

CacheStatus KvCache::truncate(SequenceId sequence, int tokens) {
  State& s = *state_;
  State::Sequence& q = s.sequence(sequence);
  if (tokens < 0 || tokens > q.length) {
    throw Error("truncate: " + std::to_string(tokens) + " tokens is outside 0.." + std::to_string(q.length) +
                " for sequence " + std::to_string(sequence));
  }
  if (tokens == q.length) return CacheStatus::ok;
  if (tokens > 0) {
    for (int c = 0; c < s.classes(); ++c) {
      if (q.dropped[static_cast<size_t>(c)] > s.needed_from(tokens, c)) {
        throw Error("truncate: sequence " + std::to_string(sequence) + " cut back to " + std::to_string(tokens) +
                    " tokens would attend positions its " + std::to_string(s.class_window[static_cast<size_t>(c)]) +
                    "-token sliding window has already released");
      }
    }
  }
  const size_t keep = static_cast<size_t>((tokens + kTileTokens - 1) / kTileTokens);
  const int open = tokens % kTileTokens;  // tokens of the cut block (0: it stays complete, or none is kept)

  // Measure: what releasing the blocks past `keep` frees, and what the cut block takes.
  uint64_t frees = 0, takes = 0;
  size_t rows_freed = 0;
  for (size_t b = keep; b < q.rows.size(); ++b) {
    frees += s.units_released(q, b);
    rows_freed += s.row_refs[q.rows[b]] == 1 ? 1 : 0;
  }
  const uint32_t cut = open != 0 ? q.rows[keep - 1] : 0;
  const bool shared = open != 0 && s.row_refs[cut] > 1;
  if (open != 0) {
    s.for_each_tile([&](int l, int h, TensorKind kind, int half) {
      const uint32_t e = s.entry(l, cut, h, kind, half);
      if (shared && entry_class(e) != TileClass::absent) takes += s.raw_units;  // copied into a tail of its own
      if (!shared && entry_class(e) == TileClass::compressed) {
        takes += s.raw_units;  // decoded into a tail, its slot freed
        frees += 1;
      }
    });
  }
  if (takes > s.pool.free_count() + frees || (shared && s.free_rows.size() + rows_freed == 0)) return CacheStatus::out_of_space;

  // Commit; nothing below can fail.
  for (size_t b = q.rows.size(); b-- > keep;) s.release_block(q, b);
  q.rows.resize(keep);
  if (open != 0) {
    const size_t row_bytes = s.row_bytes();
    std::vector<uint16_t> tile(static_cast<size_t>(kTileTokens) * s.channels);  // room for either element
    // Tokens 0..open-1 of the tile of `e`, into the raw tile of `to` (whose other rows are zero).
    const auto copy_rows = [&](int l, int h, TensorKind kind, int half, uint32_t e, uint32_t to) {
      if (entry_class(e) == TileClass::compressed) {
        s.decode_tile(e, kind, l, h, half, tile.data());
        for (int t = 0; t < open; ++t) std::memcpy(s.raw_row(to, t), reinterpret_cast<const uint8_t*>(tile.data()) + t * row_bytes, row_bytes);
      } else {
        for (int t = 0; t < open; ++t) std::memcpy(s.raw_row(to, t), s.raw_row(e, t), row_bytes);
      }
    };
    if (shared) {
      const uint32_t row = s.free_rows.back();
      s.free_rows.pop_back();
      s.row_refs[row] = 1;
      s.row_tokens[row] = static_cast<uint8_t>(open);
      for (int c = 0; c < s.classes(); ++c) s.window_refs(row, c) = static_cast<int>(keep - 1) >= q.dropped[static_cast<size_t>(c)] ? 1 : 0;
      s.for_each_tile([&](int l, int h, TensorKind kind, int half) {
        const uint32_t e = s.entry(l, cut, h, kind, half);
        uint32_t& to = s.entry(l, row, h, kind, half);
        to = kAbsentEntry;
        if (entry_class(e) == TileClass::absent) return;
        to = s.take_raw_tile();
        copy_rows(l, h, kind, half, e, to);
      });
      s.release_block(q, keep - 1);
      q.rows[keep - 1] = row;
    } else {
      s.for_each_tile([&](int l, int h, TensorKind kind, int half) {
        uint32_t& e = s.entry(l, cut, h, kind, half);
        if (entry_class(e) == TileClass::compressed) {  // decoded, its slot freed, then a tail taken
          s.decode_tile(e, kind, l, h, half, tile.data());
          s.free_tile(e);
          e = s.take_raw_tile();
          for (int t = 0; t < open; ++t) std::memcpy(s.raw_row(e, t), reinterpret_cast<const uint8_t*>(tile.data()) + t * row_bytes, row_bytes);
        } else if (entry_class(e) == TileClass::raw) {
          for (int t = open; t < kTileTokens; ++t) std::memset(s.raw_row(e, t), 0, row_bytes);
        }
      });
      s.row_tokens[cut] = static_cast<uint8_t>(open);
    }
  }
  q.length = tokens;
  if (tokens == 0) std::fill(q.dropped.begin(), q.dropped.end(), 0);
  return CacheStatus::ok;
}

KvCache KvCache::clone() const { return KvCache(std::make_unique<State>(*state_)); }

}  // namespace gaac
