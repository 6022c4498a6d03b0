// KvCache: reading values back, the views and tables kernels walk, accounting and invariant checks.
#include <algorithm>
#include <bit>
#include <cstring>
#include <map>
#include <string>

#include "cache/cache_state.hpp"
#include "gaac/kv_cache.hpp"
#include "gaac/tiling.hpp"

namespace gaac {
namespace {

std::string where(int layer, uint32_t row, int head, TensorKind kind, int half) {
  return "layer " + std::to_string(layer) + " row " + std::to_string(row) + " head " + std::to_string(head) +
         (kind == TensorKind::key ? " K" : " V") + " half " + std::to_string(half);
}

/// Escape bytes the tags of a slot of `element` tiles ask for: tag 1 one byte, tag 2 (raw) the raw
/// group's bytes (BF16 5, E4M3 2, E5M2 3).
uint32_t slot_escape_bytes(ElementFormat element, int channels, const uint8_t* slot) {
  const TileShape shape{TensorKind::key, channels};
  const bool fp8 = is_fp8(element);
  const size_t tag_offset = fp8 ? Fp8TileShape{element, shape}.tag_offset() : shape.tag_offset();
  const int raw_bytes = fp8 ? fp8_escape_bytes_for(Fp8GroupMode::raw, element) : 5;
  uint32_t bytes = 0;
  for (size_t w = 0; w < shape.tag_bytes() / 4; ++w) {
    uint32_t tags;
    std::memcpy(&tags, slot + tag_offset + 4 * w, sizeof tags);
    const uint32_t low = tags & 0x55555555u, high = (tags >> 1) & 0x55555555u;
    bytes += static_cast<uint32_t>(std::popcount(low & ~high) + raw_bytes * std::popcount(high & ~low));
  }
  return bytes;
}

}  // namespace

const PagedGeometry& KvCache::geometry() const { return state_->geo; }
CacheFormat KvCache::format() const { return state_->config.format; }
const CalibratedCodecs* KvCache::codecs() const { return state_->codecs ? &*state_->codecs : nullptr; }
const Fp8CalibratedCodecs* KvCache::fp8_codecs() const { return state_->fp8_codecs ? &*state_->fp8_codecs : nullptr; }

float KvCache::scale(int layer, TensorKind kind) const {
  const State& s = *state_;
  if (layer < 0 || layer >= s.geo.layers) throw Error("scale: layer " + std::to_string(layer) + " outside the cache");
  if (!is_fp8(s.config.format)) return 1.0f;
  return (kind == TensorKind::key ? s.config.fp8.k_scales : s.config.fp8.v_scales)[static_cast<size_t>(layer)];
}

PagedCacheView KvCache::view() const {
  const State& s = *state_;
  return {s.geo, s.pool.data(), s.entries.data(), s.bases.empty() ? nullptr : s.bases.data(), s.windows.data()};
}

SequenceTable KvCache::sequence_table(std::span<const SequenceId> sequences) const {
  SequenceTable table;
  table.indptr.push_back(0);
  for (const SequenceId id : sequences) {
    const State::Sequence& q = state_->sequence(id);
    table.rows.insert(table.rows.end(), q.rows.begin(), q.rows.end());
    table.indptr.push_back(static_cast<int32_t>(table.rows.size()));
    table.lengths.push_back(q.length);
  }
  return table;
}

void KvCache::read(SequenceId sequence, int layer, TensorKind kind, int first, const MutableKvView& out) const {
  state_->read(sequence, layer, kind, first, out);
}

void KvCache::read(SequenceId sequence, int layer, TensorKind kind, int first, const BasicKvView<uint8_t>& out) const {
  state_->read(sequence, layer, kind, first, out);
}

template <class Element>
void KvCache::State::read(SequenceId sequence, int layer, TensorKind kind, int first, const BasicKvView<Element>& out) const {
  const State& s = *this;
  s.require_element<Element>("read");
  const State::Sequence& q = s.sequence(sequence);
  if (layer < 0 || layer >= s.geo.layers) throw Error("read: layer " + std::to_string(layer) + " outside the cache");
  if (first < 0 || out.tokens < 0 || first + out.tokens > q.length) {
    throw Error("read: positions " + std::to_string(first) + ".." + std::to_string(first + out.tokens - 1) +
                " outside the sequence's " + std::to_string(q.length) + " tokens");
  }
  if (out.heads != s.geo.kv_heads || out.head_dim != s.geo.head_dim) throw Error("read: output view has the wrong shape");
  const size_t row_bytes = s.row_bytes();
  std::vector<Element> tile(static_cast<size_t>(kTileTokens) * s.channels);
  for (int p = first; p < first + out.tokens;) {
    const int block = p / kTileTokens;
    const int t0 = p % kTileTokens;
    const int count = std::min(kTileTokens - t0, first + out.tokens - p);
    const uint32_t row = q.rows[static_cast<size_t>(block)];
    for (int h = 0; h < s.geo.kv_heads; ++h) {
      for (int half = 0; half < s.halves; ++half) {
        const uint32_t e = s.entry(layer, row, h, kind, half);
        switch (entry_class(e)) {
          case TileClass::compressed: {
            const DecodeStatus status = s.decode_tile(e, kind, layer, h, half, tile.data());
            if (status != DecodeStatus::ok) throw Error("KV cache tile " + where(layer, row, h, kind, half) + ": " + to_string(status));
            for (int t = 0; t < count; ++t) {
              std::memcpy(out.at(p - first + t, h) + half * kMaxTileChannels, tile.data() + static_cast<size_t>(t0 + t) * s.channels, row_bytes);
            }
            break;
          }
          case TileClass::raw:
            for (int t = 0; t < count; ++t) std::memcpy(out.at(p - first + t, h) + half * kMaxTileChannels, s.raw_row(e, t0 + t), row_bytes);
            break;
          default:
            throw Error("read: position " + std::to_string(p) + " of layer " + std::to_string(layer) +
                        " was released by its sliding window");
        }
      }
    }
    p += count;
  }
}

KvDump KvCache::dump(SequenceId sequence) const {
  state_->require_element<uint16_t>("dump");
  const int tokens = length(sequence);
  KvDump dump;
  for (int l = 0; l < state_->geo.layers; ++l) {
    KvLayer layer;
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      KvTensor& t = layer.of(kind);
      t = {tokens, state_->geo.kv_heads, state_->geo.head_dim, {}};
      t.data.resize(t.elements());
      read(sequence, l, kind, 0, mutable_view_of(t));
    }
    dump.layers.push_back(std::move(layer));
  }
  return dump;
}

uint64_t KvCache::resident_bytes() const {
  const State& s = *state_;
  const uint64_t units = s.pool.count() - s.pool.free_count();
  const uint64_t rows = s.geo.row_capacity - s.free_rows.size();
  return units * s.geo.unit_bytes + rows * s.geo.entries_per_row() * 4;
}

CacheUsage KvCache::usage() const {
  const State& s = *state_;
  CacheUsage u;
  u.budget_bytes = s.config.budget_bytes;
  u.unit_bytes = s.geo.unit_bytes;
  u.raw_units = s.raw_units;
  u.element_bytes = s.geo.element_size();
  u.units = s.pool.count();
  u.units_free = s.pool.free_count();
  u.rows = s.geo.row_capacity;
  u.rows_used = s.geo.row_capacity - s.free_rows.size();
  u.table_bytes = s.geo.table_entries() * 4;
  const size_t capacity = s.geo.escape_capacity();
  for (uint32_t row = 0; row < s.geo.row_capacity; ++row) {
    if (s.row_refs[row] == 0) continue;
    const bool open = s.row_tokens[row] < kTileTokens;
    s.for_each_tile([&](int l, int h, TensorKind kind, int half) {
      const uint32_t e = s.entry(l, row, h, kind, half);
      if (entry_class(e) == TileClass::absent) return;
      u.elements += static_cast<uint64_t>(s.row_tokens[row]) * s.channels;
      if (open) {
        ++u.tail_tiles;
      } else if (entry_class(e) == TileClass::raw) {
        ++u.raw_tiles;
      } else {
        ++u.compressed_tiles;
        u.unused_slot_bytes += capacity - slot_escape_bytes(s.geo.element_format, s.channels, s.pool.unit(entry_unit(e)));
      }
    });
  }
  for (const State::Sequence& q : s.sequences) u.sequences += q.alive ? 1 : 0;
  return u;
}

std::span<const uint32_t> KvCache::free_units() const { return state_->pool.free_units(); }

void KvCache::check_invariants() const {
  const State& s = *state_;
  const auto fail = [](const std::string& what) { throw Error("KV cache invariant broken: " + what); };
  // Expected reference counts from the sequences.
  std::vector<uint32_t> refs(s.geo.row_capacity, 0);
  std::vector<uint16_t> window_refs(s.row_window_refs.size(), 0);
  std::vector<int> open_of(s.geo.row_capacity, -1);
  for (size_t id = 0; id < s.sequences.size(); ++id) {
    const State::Sequence& q = s.sequences[id];
    if (!q.alive) continue;
    if (q.rows.size() != static_cast<size_t>((q.length + kTileTokens - 1) / kTileTokens)) fail("sequence " + std::to_string(id) + " has the wrong number of blocks");
    for (size_t b = 0; b < q.rows.size(); ++b) {
      const uint32_t row = q.rows[b];
      if (row >= s.geo.row_capacity) fail("sequence " + std::to_string(id) + " names row " + std::to_string(row));
      ++refs[row];
      for (int c = 0; c < s.classes(); ++c) {
        if (static_cast<int>(b) >= q.dropped[static_cast<size_t>(c)]) ++window_refs[static_cast<size_t>(row) * s.classes() + c];
      }
      const bool last = b + 1 == q.rows.size();
      const int tokens = last && q.length % kTileTokens != 0 ? q.length % kTileTokens : kTileTokens;
      if (s.row_tokens[row] != tokens) fail("row " + std::to_string(row) + " holds " + std::to_string(s.row_tokens[row]) + " tokens, its sequence says " + std::to_string(tokens));
      if (tokens < kTileTokens) open_of[row] = static_cast<int>(id);
    }
  }
  std::vector<uint8_t> free_row(s.geo.row_capacity, 0);
  for (const uint32_t row : s.free_rows) {
    if (row >= s.geo.row_capacity || free_row[row]) fail("free row list holds row " + std::to_string(row) + " twice or out of range");
    free_row[row] = 1;
  }
  std::vector<uint8_t> owner(s.pool.count(), 0);  // 1 free, 2 held
  for (const uint32_t unit : s.pool.free_units()) {
    if (unit >= s.pool.count() || owner[unit]) fail("free unit list holds unit " + std::to_string(unit) + " twice or out of range");
    owner[unit] = 1;
  }
  const auto hold = [&](uint32_t unit, const std::string& at) {
    if (unit >= s.pool.count()) fail(at + " names unit " + std::to_string(unit));
    if (owner[unit]) fail(at + " holds unit " + std::to_string(unit) + ", which is free or held twice");
    owner[unit] = 2;
  };
  for (uint32_t row = 0; row < s.geo.row_capacity; ++row) {
    if (refs[row] != s.row_refs[row]) fail("row " + std::to_string(row) + " counts " + std::to_string(s.row_refs[row]) + " references, its sequences " + std::to_string(refs[row]));
    if ((refs[row] == 0) != (free_row[row] == 1)) fail("row " + std::to_string(row) + " is free and used, or neither");
    if (open_of[row] >= 0 && refs[row] != 1) fail("open row " + std::to_string(row) + " is shared");
    for (int c = 0; c < s.classes(); ++c) {
      const size_t i = static_cast<size_t>(row) * s.classes() + c;
      if (window_refs[i] != s.row_window_refs[i]) fail("row " + std::to_string(row) + " window references differ");
    }
    s.for_each_tile([&](int l, int h, TensorKind kind, int half) {
      const uint32_t e = s.entry(l, row, h, kind, half);
      const std::string at = where(l, row, h, kind, half);
      const int cls = s.layer_class[static_cast<size_t>(l)];
      const bool needed = refs[row] > 0 && (cls < 0 || s.row_window_refs[static_cast<size_t>(row) * s.classes() + cls] > 0);
      if (needed != (entry_class(e) != TileClass::absent)) fail(at + (needed ? " is absent but needed" : " is held but not needed"));
      if (entry_class(e) == TileClass::absent) return;
      if (entry_class(e) == TileClass::compressed) {
        if (!s.compressed() || open_of[row] >= 0) fail(at + " is compressed in an uncompressed cache or an open block");
        hold(entry_unit(e), at);
        std::vector<uint16_t> tile(static_cast<size_t>(kTileTokens) * s.channels);  // room for either element
        const DecodeStatus status = s.decode_tile(e, kind, l, h, half, tile.data());
        if (status != DecodeStatus::ok) fail(at + ": " + to_string(status));
      } else if (entry_class(e) == TileClass::raw) {
        hold(entry_unit(e), at);
        if (s.geo.raw_split()) hold(s.partner(entry_unit(e)), at + " (second unit)");
      } else {
        fail(at + " has class 3");
      }
    });
  }
  for (uint32_t unit = 0; unit < s.pool.count(); ++unit) {
    if (owner[unit] == 0) fail("unit " + std::to_string(unit) + " is neither free nor held (leaked)");
  }
}

}  // namespace gaac
