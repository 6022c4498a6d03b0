// KvCache: construction from a budget, sequences (add, fork, free) and the fill-then-finalize append.
#include "gaac/kv_cache.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "cache/cache_state.hpp"
#include "cache/layout.hpp"
#include "gaac/tiling.hpp"

namespace gaac {
namespace {

/// Distinct window classes the row bookkeeping has room for (models use one or two).
constexpr int kMaxWindowClasses = 8;

}  // namespace

const char* to_string(CacheFormat format) {
  switch (format) {
    case CacheFormat::gaac: return "gaac";
    case CacheFormat::bf16: return "bf16";
    case CacheFormat::gaac_fp8: return "gaac-fp8";
    case CacheFormat::fp8: return "fp8";
  }
  return "unknown";
}

uint64_t CacheUsage::resident_bytes() const { return unit_bytes_used() + table_bytes / std::max<uint64_t>(rows, 1) * rows_used; }

double CacheUsage::bits_per_element() const {
  return elements == 0 ? 0.0 : 8.0 * static_cast<double>(resident_bytes()) / static_cast<double>(elements);
}

// ---------------------------------------------------------------------------------------------
// State helpers

KvCache::State::Sequence& KvCache::State::sequence(SequenceId id) {
  if (id >= sequences.size() || !sequences[id].alive) throw Error("unknown sequence " + std::to_string(id) + " of a KV cache");
  return sequences[id];
}
const KvCache::State::Sequence& KvCache::State::sequence(SequenceId id) const {
  return const_cast<State*>(this)->sequence(id);
}

uint32_t KvCache::State::partner(uint32_t unit) const {
  uint32_t b;
  std::memcpy(&b, pool.unit(unit) + geo.partner_offset(), sizeof b);
  return b;
}

uint8_t* KvCache::State::raw_row(uint32_t e, int token) {
  const uint32_t a = entry_unit(e);
  if (geo.raw_split() && token >= kTileTokens / 2) return pool.unit(partner(a)) + static_cast<size_t>(token - kTileTokens / 2) * row_bytes();
  return pool.unit(a) + static_cast<size_t>(token) * row_bytes();
}
const uint8_t* KvCache::State::raw_row(uint32_t e, int token) const { return const_cast<State*>(this)->raw_row(e, token); }

uint32_t KvCache::State::take_raw_tile() {
  const uint32_t a = pool.take();
  std::memset(pool.unit(a), 0, geo.unit_bytes);
  if (geo.raw_split()) {
    const uint32_t b = pool.take();
    std::memset(pool.unit(b), 0, geo.unit_bytes);
    std::memcpy(pool.unit(a) + geo.partner_offset(), &b, sizeof b);
  }
  return make_entry(TileClass::raw, a);
}

TileEncoding KvCache::State::encode_tile(const uint16_t* src, size_t row_stride, TensorKind kind, int layer, int head, int half,
                                         uint8_t* slot) const {
  TileEncoding encoding;
  codecs->codec(kind, layer, head, half).encode_blocks(src, row_stride, 0, 1, slot, 0, &encoding);
  return encoding;
}

TileEncoding KvCache::State::encode_tile(const uint8_t* src, size_t row_stride, TensorKind kind, int layer, int head, int half,
                                         uint8_t* slot) const {
  TileEncoding encoding;
  fp8_codecs->codec(kind, layer, head, half).encode_blocks(src, row_stride, 0, 1, slot, 0, &encoding);
  return encoding;
}

DecodeStatus KvCache::State::decode_tile(uint32_t e, TensorKind kind, int layer, int head, int half, void* out) const {
  const uint8_t* slot = pool.unit(entry_unit(e));
  const auto stride = static_cast<size_t>(channels);
  if (fp8_codecs) return fp8_codecs->codec(kind, layer, head, half).decode_blocks(slot, 0, 1, static_cast<uint8_t*>(out), stride, 0).status;
  return codecs->codec(kind, layer, head, half).decode_blocks(slot, 0, 1, static_cast<uint16_t*>(out), stride, 0).status;
}

void KvCache::State::free_tile(uint32_t& e) {
  if (entry_class(e) == TileClass::absent) return;
  const uint32_t a = entry_unit(e);
  if (entry_class(e) == TileClass::raw && geo.raw_split()) pool.give(partner(a));
  pool.give(a);
  e = kAbsentEntry;
}

void KvCache::State::free_class_tiles(uint32_t row, int cls) {
  for_each_tile([&](int l, int h, TensorKind kind, int half) {
    if (layer_class[static_cast<size_t>(l)] == cls) free_tile(entry(l, row, h, kind, half));
  });
}

uint64_t KvCache::State::units_released(const Sequence& q, size_t b) const {
  const uint32_t row = q.rows[b];
  uint64_t units = 0;
  for_each_tile([&](int l, int h, TensorKind kind, int half) {
    const int cls = layer_class[static_cast<size_t>(l)];
    const bool last_window_ref = cls >= 0 && static_cast<int>(b) >= q.dropped[static_cast<size_t>(cls)] && window_refs(row, cls) == 1;
    if (row_refs[row] == 1 || last_window_ref) units += units_of(entry(l, row, h, kind, half));
  });
  return units;
}

void KvCache::State::release_block(const Sequence& q, size_t b) {
  const uint32_t row = q.rows[b];
  for (int cls = 0; cls < classes(); ++cls) {
    if (static_cast<int>(b) >= q.dropped[static_cast<size_t>(cls)] && --window_refs(row, cls) == 0) free_class_tiles(row, cls);
  }
  if (--row_refs[row] == 0) {
    for_each_tile([&](int l, int h, TensorKind kind, int half) { free_tile(entry(l, row, h, kind, half)); });
    row_tokens[row] = 0;
    free_rows.push_back(row);
  }
}

// ---------------------------------------------------------------------------------------------
// Construction

KvCache::KvCache(CacheConfig cache_config) : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.config = std::move(cache_config);
  const CacheConfig& config = s.config;
  const CacheGeometry& g = config.geometry;
  cache::check_geometry(g);
  s.channels = g.head_dim < kMaxTileChannels ? g.head_dim : kMaxTileChannels;
  s.halves = g.head_dim / s.channels;
  s.windows.assign(static_cast<size_t>(g.layers), 0);
  s.layer_class.assign(static_cast<size_t>(g.layers), -1);
  for (int l = 0; l < g.layers; ++l) {
    const int w = g.sliding_window.empty() ? 0 : g.sliding_window[static_cast<size_t>(l)];
    s.windows[static_cast<size_t>(l)] = w;
    if (w == 0) continue;
    auto it = std::find(s.class_window.begin(), s.class_window.end(), w);
    if (it == s.class_window.end()) {
      if (s.class_window.size() == kMaxWindowClasses) throw Error("more than 8 distinct sliding windows");
      s.class_window.push_back(w);
      it = s.class_window.end() - 1;
    }
    s.layer_class[static_cast<size_t>(l)] = static_cast<int>(it - s.class_window.begin());
  }

  s.layout = cache::layout_for(g, config.format, config.calibration, config.fp8.element);
  cache::check_fp8_config(config);
  const cache::Layout& layout = s.layout;
  const uint32_t unit_bytes = layout.unit_bytes;
  s.raw_units = layout.raw_units;
  if (config.format == CacheFormat::gaac) s.codecs.emplace(*config.calibration, layout.escape_capacity, config.backend);
  if (config.format == CacheFormat::gaac_fp8) s.fp8_codecs.emplace(*config.calibration, layout.escape_capacity, config.backend);
  if (s.compressed()) s.bases.resize(static_cast<size_t>(g.layers) * 4 * g.kv_heads * g.head_dim);
  s.geo = PagedGeometry{g.layers, g.kv_heads, g.head_dim, unit_bytes, 0, layout.element};

  const uint64_t units = layout.cache_units(config.budget_bytes, config.format);
  s.geo.row_capacity = static_cast<uint32_t>(layout.rows_for(units));
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0 && units * unit_bytes / static_cast<uint64_t>(page) >= static_cast<uint64_t>(pages)) {
    throw Error("a KV cache budget of " + std::to_string(config.budget_bytes) + " bytes is more than this machine's " +
                std::to_string(static_cast<uint64_t>(pages) * static_cast<uint64_t>(page)) + " bytes of memory; give a smaller budget");
  }
  s.pool = cache::UnitPool(static_cast<uint32_t>(units), unit_bytes);
  s.entries.assign(s.geo.table_entries(), kAbsentEntry);
  s.free_rows.resize(s.geo.row_capacity);
  for (uint32_t r = 0; r < s.geo.row_capacity; ++r) s.free_rows[r] = s.geo.row_capacity - 1 - r;
  s.row_refs.assign(s.geo.row_capacity, 0);
  s.row_window_refs.assign(static_cast<size_t>(s.geo.row_capacity) * s.class_window.size(), 0);
  s.row_tokens.assign(s.geo.row_capacity, 0);
  if (s.compressed()) cache::fill_bases(*config.calibration, s.geo, s.bases.data());
  s.config.calibration = nullptr;  // everything needed is copied: the table need not outlive the cache
}

KvCache::KvCache(std::unique_ptr<State> state) : state_(std::move(state)) {}
KvCache::~KvCache() = default;
KvCache::KvCache(KvCache&&) noexcept = default;
KvCache& KvCache::operator=(KvCache&&) noexcept = default;

// ---------------------------------------------------------------------------------------------
// Sequences

SequenceId KvCache::add_sequence() {
  State& s = *state_;
  SequenceId id;
  if (!s.free_ids.empty()) {
    id = s.free_ids.back();
    s.free_ids.pop_back();
  } else {
    id = static_cast<SequenceId>(s.sequences.size());
    s.sequences.emplace_back();
  }
  State::Sequence& q = s.sequences[id];
  q = State::Sequence{};
  q.alive = true;
  q.dropped.assign(static_cast<size_t>(s.classes()), 0);
  return id;
}

bool KvCache::contains(SequenceId sequence) const {
  return sequence < state_->sequences.size() && state_->sequences[sequence].alive;
}

int KvCache::length(SequenceId sequence) const { return state_->sequence(sequence).length; }

CacheStatus KvCache::fork(SequenceId parent, SequenceId& child) {
  State& s = *state_;
  const State::Sequence& p = s.sequence(parent);
  const bool open = p.length % kTileTokens != 0;
  uint64_t units = 0;
  if (open) {
    s.for_each_tile([&](int l, int h, TensorKind kind, int half) { units += s.units_of(s.entry(l, p.rows.back(), h, kind, half)); });
    if (units > s.pool.free_count() || s.free_rows.empty()) return CacheStatus::out_of_space;
  }
  const SequenceId id = add_sequence();
  State::Sequence& c = s.sequences[id];
  const State::Sequence& pp = s.sequences[parent];  // add_sequence may have moved the vector
  c.length = pp.length;
  c.dropped = pp.dropped;
  c.rows = pp.rows;
  const size_t shared = open ? c.rows.size() - 1 : c.rows.size();
  for (size_t b = 0; b < shared; ++b) {
    ++s.row_refs[c.rows[b]];
    for (int cls = 0; cls < s.classes(); ++cls) {
      if (static_cast<int>(b) >= c.dropped[static_cast<size_t>(cls)]) ++s.window_refs(c.rows[b], cls);
    }
  }
  if (open) {
    const uint32_t from = c.rows.back();
    const uint32_t row = s.free_rows.back();
    s.free_rows.pop_back();
    s.row_refs[row] = 1;
    s.row_tokens[row] = s.row_tokens[from];
    for (int cls = 0; cls < s.classes(); ++cls) {
      s.window_refs(row, cls) = static_cast<int>(shared) >= c.dropped[static_cast<size_t>(cls)] ? 1 : 0;
    }
    s.for_each_tile([&](int l, int h, TensorKind kind, int half) {
      const uint32_t e = s.entry(l, from, h, kind, half);
      uint32_t& to = s.entry(l, row, h, kind, half);
      to = kAbsentEntry;
      if (entry_class(e) == TileClass::absent) return;
      to = s.take_raw_tile();
      for (int t = 0; t < s.row_tokens[from]; ++t) std::memcpy(s.raw_row(to, t), s.raw_row(e, t), s.row_bytes());
    });
    c.rows.back() = row;
  }
  child = id;
  return CacheStatus::ok;
}

void KvCache::free_sequence(SequenceId sequence) {
  State& s = *state_;
  State::Sequence& q = s.sequence(sequence);
  for (size_t b = 0; b < q.rows.size(); ++b) s.release_block(q, b);
  q = State::Sequence{};
  s.free_ids.push_back(sequence);
}

// ---------------------------------------------------------------------------------------------
// Appending

namespace {

/// One tile to encode during an append: of the open block (block −1) or of new complete block j.
struct EncodeJob {
  int block;
  int layer, head, half;
  TensorKind kind;
};

}  // namespace

namespace {

/// Block rows an append of `tokens` tokens opens for a sequence of `length` tokens.
int rows_opened(int length, int tokens) {
  const int open_room = length % kTileTokens == 0 ? 0 : kTileTokens - length % kTileTokens;
  const int rest = std::max(0, tokens - open_room);
  return (rest + kTileTokens - 1) / kTileTokens;
}

}  // namespace

bool KvCache::can_append(SequenceId sequence, int tokens) const {
  const State& s = *state_;
  if (tokens < 0) throw Error("cannot append a negative number of tokens (" + std::to_string(tokens) + ")");
  const auto rows = static_cast<uint64_t>(rows_opened(s.sequence(sequence).length, tokens));
  return rows <= s.free_rows.size() && rows * s.geo.entries_per_row() * s.raw_units <= s.pool.free_count();
}

AppendOutcome KvCache::append(SequenceId sequence, std::span<const KvView> k, std::span<const KvView> v) {
  return state_->append<uint16_t>(sequence, k, v);
}

AppendOutcome KvCache::append(SequenceId sequence, std::span<const Fp8KvView> k, std::span<const Fp8KvView> v) {
  return state_->append<uint8_t>(sequence, k, v);
}

template <class Element>
AppendOutcome KvCache::State::append(SequenceId sequence, std::span<const BasicKvView<const Element>> k,
                                     std::span<const BasicKvView<const Element>> v) {
  using View = BasicKvView<const Element>;
  State& s = *this;
  s.require_element<Element>("append");
  State::Sequence& q = s.sequence(sequence);
  const PagedGeometry& g = s.geo;
  if (k.size() != static_cast<size_t>(g.layers) || v.size() != k.size()) {
    throw Error("append needs K and V rows for each of the " + std::to_string(g.layers) + " layers, got " +
                std::to_string(k.size()) + " and " + std::to_string(v.size()));
  }
  const int n = k[0].tokens;
  for (int l = 0; l < g.layers; ++l) {
    for (const View* view : {&k[static_cast<size_t>(l)], &v[static_cast<size_t>(l)]}) {
      if (view->tokens != n || view->heads != g.kv_heads || view->head_dim != g.head_dim || view->data == nullptr) {
        throw Error("append: layer " + std::to_string(l) + " rows are [" + std::to_string(view->tokens) + ", " +
                    std::to_string(view->heads) + ", " + std::to_string(view->head_dim) + "], expected [" +
                    std::to_string(n) + ", " + std::to_string(g.kv_heads) + ", " + std::to_string(g.head_dim) + "]");
      }
    }
  }
  if (n == 0) return {};
  if (static_cast<int64_t>(q.length) + n > (int64_t{1} << 30)) throw Error("a sequence of more than 2^30 tokens");

  const int r0 = q.length % kTileTokens;
  const bool open = r0 != 0;
  const int fill = open ? std::min(n, kTileTokens - r0) : 0;
  const bool completes = open && r0 + fill == kTileTokens;
  const int rest = n - fill;
  const int new_full = rest / kTileTokens;
  const int new_tail = rest % kTileTokens;
  const int new_rows = new_full + (new_tail > 0 ? 1 : 0);
  const int old_blocks = static_cast<int>(q.rows.size());
  const int length = q.length + n;
  std::vector<int> target(static_cast<size_t>(s.classes()));
  for (int c = 0; c < s.classes(); ++c) target[static_cast<size_t>(c)] = std::max(q.dropped[static_cast<size_t>(c)], s.needed_from(length, c));
  // Whether block b (of the sequence after the append) is no longer needed by the layers of `layer`.
  const auto dropped_for = [&](int b, int layer) {
    const int c = s.layer_class[static_cast<size_t>(layer)];
    return c >= 0 && b < target[static_cast<size_t>(c)];
  };
  // Row of token `t` of the append: (tokens of the append live at positions q.length + t).
  const auto input_row = [&](const View& view, int t, int head, int half) {
    return view.at(t, head) + static_cast<size_t>(half) * kMaxTileChannels;
  };

  // Units the append frees whatever the values: blocks leaving a window.
  uint64_t frees = 0;
  for (int c = 0; c < s.classes(); ++c) {
    for (int b = q.dropped[static_cast<size_t>(c)]; b < std::min(target[static_cast<size_t>(c)], old_blocks); ++b) {
      const uint32_t row = q.rows[static_cast<size_t>(b)];
      if (s.window_refs(row, c) != 1) continue;
      s.for_each_tile([&](int l, int h, TensorKind kind, int half) {
        if (s.layer_class[static_cast<size_t>(l)] == c) frees += s.units_of(s.entry(l, row, h, kind, half));
      });
    }
  }
  const uint64_t entry_bytes = g.entries_per_row() * 4;
  const uint64_t rows_used = g.row_capacity - s.free_rows.size();
  const uint64_t units_used = s.pool.count() - s.pool.free_count();
  // The outcome of an append that takes `takes` units and frees `released` (beyond the window's).
  const auto refused = [&](uint64_t takes, uint64_t released, bool measured) {
    const uint64_t free_units = s.pool.free_count() + frees + released;
    return AppendOutcome{CacheStatus::out_of_space, takes * g.unit_bytes + static_cast<uint64_t>(new_rows) * entry_bytes,
                         free_units * g.unit_bytes + s.free_rows.size() * entry_bytes,
                         s.layout.least_budget(units_used + takes - std::min(takes, frees + released), rows_used + new_rows),
                         measured};
  };
  // The best case first, every completed tile compressed: an append that cannot fit even so is
  // refused before anything is encoded, at no cost in proportion to its size.
  {
    uint64_t takes = 0, released = 0;
    if (completes && s.compressed()) {
      s.for_each_tile([&](int l, int h, TensorKind kind, int half) {
        if (!dropped_for(old_blocks - 1, l) && entry_class(s.entry(l, q.rows.back(), h, kind, half)) != TileClass::absent) {
          released += s.raw_units;
          takes += 1;
        }
      });
    }
    for (int j = 0; j < new_full; ++j) {
      for (int l = 0; l < g.layers; ++l) {
        if (!dropped_for(old_blocks + j, l)) takes += static_cast<uint64_t>(g.entries_per_layer_row());
      }
    }
    if (new_tail > 0) takes += g.entries_per_row() * s.raw_units;
    if (takes > s.pool.free_count() + frees + released || static_cast<size_t>(new_rows) > s.free_rows.size()) {
      return refused(takes, released, !s.compressed() || (!completes && new_full == 0));  // exact when nothing is encoded
    }
  }

  // Phase 1: encode every tile that this append completes, so the units it needs are known exactly.
  std::vector<EncodeJob> jobs;
  if (s.compressed()) {
    const auto add_block = [&](int job_block, int sequence_block) {
      s.for_each_tile([&](int l, int h, TensorKind kind, int half) {
        if (!dropped_for(sequence_block, l) && !(job_block < 0 && entry_class(s.entry(l, q.rows.back(), h, kind, half)) == TileClass::absent)) {
          jobs.push_back({job_block, l, h, half, kind});
        }
      });
    };
    if (completes) add_block(-1, old_blocks - 1);
    for (int j = 0; j < new_full; ++j) add_block(j, old_blocks + j);
  }
  const size_t unit_bytes = g.unit_bytes;
  std::vector<uint8_t> slots(jobs.size() * unit_bytes);
  std::vector<TileEncoding> encodings(jobs.size());
  const auto encode = [&](size_t begin, size_t end) {
    std::vector<Element> tile(static_cast<size_t>(kTileTokens) * s.channels);
    for (size_t i = begin; i < end; ++i) {
      const EncodeJob& job = jobs[i];
      const View& view = (job.kind == TensorKind::key ? k : v)[static_cast<size_t>(job.layer)];
      uint8_t* slot = slots.data() + i * unit_bytes;
      if (job.block >= 0) {
        const Element* src = input_row(view, fill + job.block * kTileTokens, job.head, job.half);
        encodings[i] = s.encode_tile(src, view.token_stride, job.kind, job.layer, job.head, job.half, slot);
        continue;
      }
      // The open block: its tail rows, then the rows that complete it.
      const uint32_t e = s.entry(job.layer, q.rows.back(), job.head, job.kind, job.half);
      for (int t = 0; t < kTileTokens; ++t) {
        const void* from = t < r0 ? static_cast<const void*>(s.raw_row(e, t)) : input_row(view, t - r0, job.head, job.half);
        std::memcpy(tile.data() + static_cast<size_t>(t) * s.channels, from, s.row_bytes());
      }
      encodings[i] = s.encode_tile(tile.data(), static_cast<size_t>(s.channels), job.kind, job.layer, job.head, job.half, slot);
    }
  };
  if (s.config.parallel && jobs.size() > 1) {
    s.config.parallel(jobs.size(), encode);
  } else {
    encode(0, jobs.size());
  }

  // Units: what the append frees (besides the window's: open-block tiles that compress), then what
  // it takes.
  uint64_t released = 0, takes = 0;
  size_t next = 0;
  if (completes && s.compressed()) {
    for (; next < jobs.size() && jobs[next].block < 0; ++next) {
      if (encodings[next].fits) {
        released += s.raw_units;
        takes += 1;
      }
    }
  }
  for (size_t i = next; i < jobs.size(); ++i) takes += encodings[i].fits ? 1 : s.raw_units;
  if (!s.compressed()) {
    for (int j = 0; j < new_full; ++j) {
      for (int l = 0; l < g.layers; ++l) {
        if (!dropped_for(old_blocks + j, l)) takes += static_cast<uint64_t>(g.entries_per_layer_row()) * s.raw_units;
      }
    }
  }
  if (new_tail > 0) takes += g.entries_per_row() * s.raw_units;
  if (takes > s.pool.free_count() + frees + released) return refused(takes, released, true);

  // Phase 2: commit; nothing below can fail.
  const size_t row_bytes = s.row_bytes();
  for (int c = 0; c < s.classes(); ++c) {
    for (int b = q.dropped[static_cast<size_t>(c)]; b < std::min(target[static_cast<size_t>(c)], old_blocks); ++b) {
      const uint32_t row = q.rows[static_cast<size_t>(b)];
      if (--s.window_refs(row, c) == 0) s.free_class_tiles(row, c);
    }
  }
  if (open) {
    const uint32_t row = q.rows.back();
    s.for_each_tile([&](int l, int h, TensorKind kind, int half) {
      const uint32_t e = s.entry(l, row, h, kind, half);
      if (entry_class(e) == TileClass::absent) return;
      const View& view = (kind == TensorKind::key ? k : v)[static_cast<size_t>(l)];
      for (int t = 0; t < fill; ++t) std::memcpy(s.raw_row(e, r0 + t), input_row(view, t, h, half), row_bytes);
    });
    s.row_tokens[row] = static_cast<uint8_t>(r0 + fill);
    for (size_t i = 0; i < next; ++i) {
      if (!encodings[i].fits) continue;
      const EncodeJob& job = jobs[i];
      uint32_t& e = s.entry(job.layer, row, job.head, job.kind, job.half);
      s.free_tile(e);
      const uint32_t unit = s.pool.take();
      std::memcpy(s.pool.unit(unit), slots.data() + i * unit_bytes, unit_bytes);
      e = make_entry(TileClass::compressed, unit);
    }
  }
  size_t job = next;
  for (int j = 0; j < new_rows; ++j) {
    const int block = old_blocks + j;
    const bool full = j < new_full;
    const uint32_t row = s.free_rows.back();
    s.free_rows.pop_back();
    s.row_refs[row] = 1;
    s.row_tokens[row] = static_cast<uint8_t>(full ? kTileTokens : new_tail);
    for (int c = 0; c < s.classes(); ++c) s.window_refs(row, c) = block < target[static_cast<size_t>(c)] ? 0 : 1;
    const int first = fill + j * kTileTokens;
    const int count = full ? kTileTokens : new_tail;
    s.for_each_tile([&](int l, int h, TensorKind kind, int half) {
      uint32_t& e = s.entry(l, row, h, kind, half);
      e = kAbsentEntry;
      if (dropped_for(block, l)) return;
      if (full && s.compressed()) {
        const size_t i = job++;
        if (encodings[i].fits) {
          const uint32_t unit = s.pool.take();
          std::memcpy(s.pool.unit(unit), slots.data() + i * unit_bytes, unit_bytes);
          e = make_entry(TileClass::compressed, unit);
          return;
        }
      }
      e = s.take_raw_tile();
      const View& view = (kind == TensorKind::key ? k : v)[static_cast<size_t>(l)];
      for (int t = 0; t < count; ++t) std::memcpy(s.raw_row(e, t), input_row(view, first + t, h, half), row_bytes);
    });
    q.rows.push_back(row);
  }
  q.length = length;
  for (int c = 0; c < s.classes(); ++c) q.dropped[static_cast<size_t>(c)] = target[static_cast<size_t>(c)];
  return {};
}

}  // namespace gaac
