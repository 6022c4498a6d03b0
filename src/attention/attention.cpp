// CPU decode attention over a paged cache: (query, KV head, range) jobs walk the block table, score
// and fold block by block under one online softmax, and merge their ranges; a prefill's consecutive
// queries go as (query tile, KV head) jobs that read each block once for the whole tile.
#include "gaac/attention.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "attention/attention_internal.hpp"
#include "attention/fp8_widening.hpp"
#include "gaac/bf16.hpp"
#include "gaac/error.hpp"

namespace gaac {

const char* to_string(AttentionPath path) { return path == AttentionPath::fused ? "fused" : "reference"; }

namespace attention {
namespace {

/// Most query heads one KV head may serve (the kernels' scratch is sized for it).
constexpr int kMaxGroup = kMaxQueryHeads;

/// What one (query, KV head) needs to know about its sequence.
struct QuerySequence {
  const uint32_t* rows;  ///< the sequence's block rows
  int length;            ///< tokens in the cache
  int first, last;       ///< positions attended, inclusive
};

/// Queries [begin, end) of the call: one, or consecutive positions of one sequence with the same
/// rows not yet cached (a prefill's), whose blocks are read once for all of them.
struct QueryRange {
  size_t begin, end;
};

/// The compressed tiles of the cached blocks that several query tiles of one sequence read, decoded
/// once per call (a prefill in passes reads every earlier block from each of its tiles).
struct DecodedBlocks {
  SequenceId sequence = 0;
  int first_block = 0, blocks = 0;
  /// [block − first_block][KV head][K, V][half]: 16 × tile_channels BF16 rows, where that tile is
  /// compressed (raw tiles are read where they are).
  std::vector<uint16_t> rows;
  size_t query = 0;  ///< one of the sequence's queries (its block rows)
  int tiles = 0;     ///< query tiles of the call that read them
};

/// Scratch of one worker.
struct Scratch {
  std::vector<float> q, acc, scores, rescale, weight;
  std::vector<float> q_compressed;  // q as the compressed key kernel reads it (Kernels::prepare_compressed_query)
  std::vector<uint16_t> tiles;  // decoded tiles of the reference path: [K/V][half][16 × C]
  std::vector<Partial> partials;
  std::vector<float> max, sum;       // a query tile's softmax states, per lane
  std::vector<TokenRange> ranges;    // a query tile's queries' positions in the current block
  std::vector<float> tile_scratch;  // the query-tile kernel's
};

class Runner {
 public:
  Runner(const KvCache& cache, int layer, std::span<const AttentionQuery> queries, const AttentionOptions& o,
         const Kernels& kernels)
      : cache_(cache), view_(cache.view()), layer_(layer), queries_(queries), o_(o), kernels_(kernels) {
    const PagedGeometry& g = view_.geometry;
    if (layer < 0 || layer >= g.layers) throw Error("attention: layer " + std::to_string(layer) + " outside the cache's " + std::to_string(g.layers));
    if (o.q_heads <= 0 || o.q_heads % g.kv_heads != 0) {
      throw Error("attention: " + std::to_string(o.q_heads) + " query heads do not divide over " + std::to_string(g.kv_heads) + " KV heads");
    }
    group_ = o.q_heads / g.kv_heads;
    if (group_ > kMaxGroup) throw Error("attention: more than 64 query heads per KV head");
    if (o.splits < 1) throw Error("attention: splits must be at least 1, got " + std::to_string(o.splits));
    const int window = o.window < 0 ? view_.windows[layer] : o.window;
    key_scale_ = o.scale;
    if (is_fp8(g.element_format)) {
      // Codes widen exactly; the layer's scales multiply the softmax scale and the output's 1/S instead (for
      // a BF16 cache both factors stay as they are).
      widening_ = &fp8_widening(g.element_format);
      key_scale_ = o.scale * cache.scale(layer, TensorKind::key);
      value_scale_ = cache.scale(layer, TensorKind::value);
    }
    std::vector<SequenceId> ids;
    for (const AttentionQuery& q : queries) ids.push_back(q.sequence);
    table_ = cache.sequence_table(ids);  // throws on an unknown sequence
    for (size_t i = 0; i < queries.size(); ++i) {
      const AttentionQuery& q = queries[i];
      const int length = table_.lengths[i];
      const int extra = q.extra_k.data == nullptr ? 0 : q.extra_k.tokens;
      if (q.q == nullptr || q.out == nullptr) throw Error("attention: query " + std::to_string(i) + " has no q or out");
      if (extra > 0 && is_fp8(g.element_format)) {
        throw Error("attention: query " + std::to_string(i) + " has extra rows, which an FP8 cache does not take (append its codes first)");
      }
      if (extra > 0) {
        for (const KvView* v : {&q.extra_k, &q.extra_v}) {
          if (v->data == nullptr || v->tokens != extra || v->heads != g.kv_heads || v->head_dim != g.head_dim) {
            throw Error("attention: query " + std::to_string(i) + " has extra rows of the wrong shape");
          }
        }
      }
      if (q.position < 0 || q.position >= length + extra) {
        throw Error("attention: query " + std::to_string(i) + " at position " + std::to_string(q.position) + " but its sequence has " +
                    std::to_string(length) + " cached and " + std::to_string(extra) + " extra tokens");
      }
      sequences_.push_back({table_.rows.data() + table_.indptr[i], length, first_attended(q.position, window), q.position});
    }
  }

  void run() {
    const size_t heads = static_cast<size_t>(view_.geometry.kv_heads), splits = static_cast<size_t>(o_.splits);
    if (splits > 1) {
      partials_.resize(queries_.size() * heads * splits * static_cast<size_t>(group_));
      partial_acc_.resize(partials_.size() * static_cast<size_t>(view_.geometry.head_dim));
    }
    const std::vector<QueryRange> ranges = query_ranges();
    decode_shared_blocks(ranges);
    // Jobs: (range, KV head, split), the last ranges first: in a prefill they attend the most
    // positions, and taken first they leave the short ones to even out the threads' shares.
    const size_t jobs = ranges.size() * heads * splits;
    const auto body = [&](size_t begin, size_t end) {
      Scratch scratch;
      for (size_t j = begin; j < end; ++j) {
        const QueryRange& r = ranges[ranges.size() - 1 - j / (heads * splits)];
        const auto head = static_cast<int>(j / splits % heads);
        if (r.end - r.begin == 1) {
          run_job((r.begin * heads + static_cast<size_t>(head)) * splits + j % splits, scratch);
        } else {
          run_tile(r, head, scratch);
        }
      }
    };
    if (o_.parallel && jobs > 1) {
      o_.parallel(jobs, body);
    } else {
      body(0, jobs);
    }
    if (o_.splits > 1) merge();
  }

 private:
  /// The calls' queries cut into ranges: with one split, runs of consecutive positions of one
  /// sequence sharing their extra rows, up to kMaxTileQueries each; otherwise one query each.
  std::vector<QueryRange> query_ranges() const {
    std::vector<QueryRange> ranges;
    for (size_t i = 0; i < queries_.size(); ++i) {
      if (o_.splits == 1 && !ranges.empty() && ranges.back().end - ranges.back().begin < kMaxTileQueries) {
        const AttentionQuery& a = queries_[i - 1];
        const AttentionQuery& b = queries_[i];
        const bool same_rows = a.extra_k.data == b.extra_k.data && a.extra_v.data == b.extra_v.data &&
                               a.extra_k.tokens == b.extra_k.tokens && a.extra_v.tokens == b.extra_v.tokens;
        if (a.sequence == b.sequence && b.position == a.position + 1 && same_rows) {
          ranges.back().end = i + 1;
          continue;
        }
      }
      ranges.push_back({i, i + 1});
    }
    return ranges;
  }

  /// Fills shared_ for every sequence that two or more query tiles read: the compressed tiles of
  /// the cached blocks those tiles attend, decoded in parallel.
  void decode_shared_blocks(const std::vector<QueryRange>& ranges) {
    const PagedGeometry& g = view_.geometry;
    for (const QueryRange& r : ranges) {
      if (r.end - r.begin < 2) continue;
      const QuerySequence& p = sequences_[r.begin];
      const int last = std::min(p.length - 1, sequences_[r.end - 1].last);
      if (last < p.first) continue;
      const SequenceId id = queries_[r.begin].sequence;
      auto it = std::find_if(shared_.begin(), shared_.end(), [&](const DecodedBlocks& x) { return x.sequence == id; });
      if (it == shared_.end()) {
        shared_.push_back(DecodedBlocks{id, p.first / kTileTokens, 0, {}, r.begin, 0});
        it = shared_.end() - 1;
      }
      const int end_block = std::max(it->first_block + it->blocks, last / kTileTokens + 1);
      it->first_block = std::min(it->first_block, p.first / kTileTokens);
      it->blocks = end_block - it->first_block;
      ++it->tiles;
    }
    std::erase_if(shared_, [](const DecodedBlocks& x) { return x.tiles < 2; });
    if (shared_.empty()) return;
    const size_t tile = static_cast<size_t>(kTileTokens) * g.tile_channels();
    const size_t per_block = static_cast<size_t>(g.kv_heads) * 2 * g.halves() * tile;
    std::vector<std::pair<size_t, int>> jobs;  // (sequence, block)
    for (size_t i = 0; i < shared_.size(); ++i) {
      DecodedBlocks& d = shared_[i];
      d.rows.resize(static_cast<size_t>(d.blocks) * per_block);
      for (int b = 0; b < d.blocks; ++b) jobs.emplace_back(i, b);
    }
    const auto body = [&](size_t begin, size_t end) {
      for (size_t j = begin; j < end; ++j) {
        DecodedBlocks& d = shared_[jobs[j].first];
        const QuerySequence& p = sequences_[d.query];
        const int block = d.first_block + jobs[j].second;
        for (int head = 0; head < g.kv_heads; ++head) {
          for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
            for (int half = 0; half < g.halves(); ++half) {
              const uint32_t e = view_.entries[g.entry_index(layer_, p.rows[block], head, kind, half)];
              if (entry_class(e) != TileClass::compressed) continue;
              uint16_t* out = d.rows.data() + static_cast<size_t>(jobs[j].second) * per_block +
                              ((static_cast<size_t>(head) * 2 + (kind == TensorKind::key ? 0 : 1)) * g.halves() + half) * tile;
              decode_tile(e, kind, head, half, out);
            }
          }
        }
      }
    };
    if (o_.parallel && jobs.size() > 1) {
      o_.parallel(jobs.size(), body);
    } else {
      body(0, jobs.size());
    }
  }

  /// Decodes the compressed tile of entry `e` (kind, head, half of this layer) to 16 BF16 rows (an FP8
  /// tile's codes widened to their BF16 operands).
  void decode_tile(uint32_t e, TensorKind kind, int head, int half, uint16_t* out) const {
    const uint8_t* slot = view_.units + view_.geometry.unit_offset(entry_unit(e));
    const auto channels = static_cast<size_t>(view_.geometry.tile_channels());
    std::array<uint8_t, kTileTokens * kMaxTileChannels> codes;
    const BlockDecodeResult r = fp8() ? cache_.fp8_codecs()->codec(kind, layer_, head, half).decode_blocks(slot, 0, 1, codes.data(), channels, 0)
                                      : cache_.codecs()->codec(kind, layer_, head, half).decode_blocks(slot, 0, 1, out, channels, 0);
    if (r.status != DecodeStatus::ok) throw Error(std::string("attention: a compressed tile does not decode: ") + to_string(r.status));
    if (fp8()) widen(widening(), codes.data(), kTileTokens * channels, out);
  }

  /// True for a cache of FP8 codes, whose tiles are read as BF16 rows widened from them.
  bool fp8() const { return is_fp8(view_.geometry.element_format); }
  /// The widening of the cache's codes (one table for K and V: their scales apply to scores and output).
  const Fp8Widening& widening() const { return *widening_; }

  /// The decoded tiles of `sequence` when several query tiles share them, else null.
  const DecodedBlocks* shared_blocks(SequenceId sequence) const {
    for (const DecodedBlocks& x : shared_) {
      if (x.sequence == sequence) return &x;
    }
    return nullptr;
  }

  /// Sources of the K or V tiles of one block of one head (null when the position range needs none).
  /// With `rows_only`, compressed tiles are always read as rows (the query-tile kernels read rows):
  /// from `decoded` where it holds the block, else decoded here.
  void block_sources(const QuerySequence& p, int block, int head, TensorKind kind, int t0, int t1, TileSource* out, Scratch& s,
                     int scratch_slot, bool rows_only = false, const DecodedBlocks* decoded = nullptr) const {
    const PagedGeometry& g = view_.geometry;
    const uint32_t row = p.rows[block];
    const int channels = g.tile_channels();
    for (int half = 0; half < g.halves(); ++half) {
      TileSource& src = out[half];
      src = TileSource{};
      const uint32_t e = view_.entries[g.entry_index(layer_, row, head, kind, half)];
      const uint8_t* a = view_.units + g.unit_offset(entry_unit(e));
      if (entry_class(e) == TileClass::compressed) {
        if (o_.path == AttentionPath::fused && !rows_only && !fp8() && !mixed_halves(row, head, kind)) {
          src.codec = &cache_.codecs()->codec(kind, layer_, head, half);
          src.slot = a;
          continue;
        }
        const uint16_t* tile;
        if (decoded != nullptr && block >= decoded->first_block && block < decoded->first_block + decoded->blocks) {
          const size_t size = static_cast<size_t>(kTileTokens) * channels;
          tile = decoded->rows.data() + static_cast<size_t>(block - decoded->first_block) * g.kv_heads * 2 * g.halves() * size +
                 ((static_cast<size_t>(head) * 2 + (kind == TensorKind::key ? 0 : 1)) * g.halves() + half) * size;
        } else {
          uint16_t* into = s.tiles.data() + static_cast<size_t>(scratch_slot * 2 + half) * kTileTokens * channels;
          decode_tile(e, kind, head, half, into);
          tile = into;
        }
        for (int t = t0; t < t1; ++t) src.rows[t] = tile + static_cast<size_t>(t) * channels;
      } else if (entry_class(e) == TileClass::raw) {
        const size_t row_bytes = g.row_bytes();
        const uint8_t* second = a + g.raw_half_bytes();
        if (g.raw_split()) {
          uint32_t b;
          std::memcpy(&b, a + g.partner_offset(), sizeof b);
          second = view_.units + g.unit_offset(b);
        }
        uint16_t* widened = s.tiles.data() + static_cast<size_t>(scratch_slot * 2 + half) * kTileTokens * channels;
        for (int t = t0; t < t1; ++t) {
          const uint8_t* at = t < kTileTokens / 2 ? a + t * row_bytes : second + (t - kTileTokens / 2) * row_bytes;
          if (fp8()) {
            uint16_t* into = widened + static_cast<size_t>(t) * channels;
            widen(widening(), at, static_cast<size_t>(channels), into);
            src.rows[t] = into;
          } else {
            src.rows[t] = reinterpret_cast<const uint16_t*>(at);
          }
        }
      } else {
        throw Error("attention: layer " + std::to_string(layer_) + " position " + std::to_string(block * kTileTokens + t0) +
                    " was released by its sliding window");
      }
    }
  }

  /// True when the half-heads of one tile are stored in different classes (one compressed, one raw:
  /// rare, a fallback of one half of a 256-wide head); the kernels take a head of one kind, so such a
  /// head is read as raw rows, its compressed half decoded first.
  bool mixed_halves(uint32_t row, int head, TensorKind kind) const {
    const PagedGeometry& g = view_.geometry;
    if (g.halves() == 1) return false;
    const TileClass first = entry_class(view_.entries[g.entry_index(layer_, row, head, kind, 0)]);
    return entry_class(view_.entries[g.entry_index(layer_, row, head, kind, 1)]) != first;
  }

  /// Scores, softmax and fold of tokens [t0, t1) of one segment whose K and V sources are given.
  void segment(const TileSource* k, const TileSource* v, int t0, int t1, Scratch& s) const {
    const PagedGeometry& g = view_.geometry;
    BlockTask task{k, g.halves(), g.tile_channels(), t0, t1, group_};
    const bool compressed_k = k[0].codec != nullptr;
    if (compressed_k) {
      const float* q = kernels_.prepare_compressed_query != nullptr ? s.q_compressed.data() : s.q.data();
      kernels_.key_scores_compressed(task, q, key_scale_, s.scores.data());
    } else {
      kernels_.key_scores_raw(task, s.q.data(), key_scale_, s.scores.data());
    }
    for (int h = 0; h < group_; ++h) {
      online_softmax(s.scores.data() + h * kTileTokens, t0, t1, s.partials[static_cast<size_t>(h)], s.rescale.data() + h * kTileTokens,
                     s.weight.data() + h * kTileTokens);
    }
    task.halves = v;
    const bool compressed_v = v[0].codec != nullptr;
    (compressed_v ? kernels_.fold_values_compressed : kernels_.fold_values_raw)(task, s.rescale.data(), s.weight.data(), s.acc.data());
  }

  void run_job(size_t job, Scratch& s) {
    const PagedGeometry& g = view_.geometry;
    const int splits = o_.splits, heads = g.kv_heads, d = g.head_dim;
    const size_t qi = job / static_cast<size_t>(heads * splits);
    const int head = static_cast<int>(job / static_cast<size_t>(splits) % static_cast<size_t>(heads));
    const int split = static_cast<int>(job % static_cast<size_t>(splits));
    const AttentionQuery& query = queries_[qi];
    const QuerySequence& p = sequences_[qi];
    const size_t gd = static_cast<size_t>(group_) * d;
    s.q.resize(gd);
    s.acc.assign(gd, 0.0f);
    s.scores.resize(static_cast<size_t>(group_) * kTileTokens);
    s.rescale.resize(s.scores.size());
    s.weight.resize(s.scores.size());
    s.tiles.resize(static_cast<size_t>(4 * kTileTokens) * g.tile_channels());
    s.partials.assign(static_cast<size_t>(group_), Partial{});
    const float* q = query.q + static_cast<size_t>(head) * gd;
    for (size_t i = 0; i < gd; ++i) s.q[i] = bf16_to_float(float_to_bf16(q[i]));
    if (kernels_.prepare_compressed_query != nullptr) {
      s.q_compressed.resize(gd);
      kernels_.prepare_compressed_query(group_, d, s.q.data(), s.q_compressed.data());
    }

    // This split's positions: whole blocks of the attended range.
    const int first_block = p.first / kTileTokens, last_block = p.last / kTileTokens;
    const int per = (last_block - first_block + splits) / splits;
    const int from = std::max(p.first, (first_block + split * per) * kTileTokens);
    const int to = std::min(p.last, (first_block + (split + 1) * per) * kTileTokens - 1);
    TileSource k[2], v[2];
    for (int pos = from; pos <= to;) {
      const int block = pos / kTileTokens, t0 = pos % kTileTokens;
      if (pos < p.length) {  // cached positions of this block
        const int t1 = std::min({kTileTokens, to - block * kTileTokens + 1, p.length - block * kTileTokens});
        block_sources(p, block, head, TensorKind::key, t0, t1, k, s, 0);
        block_sources(p, block, head, TensorKind::value, t0, t1, v, s, 1);
        segment(k, v, t0, t1, s);
        pos = block * kTileTokens + t1;
      } else {  // rows given with the query, up to 16 at a time
        const int e0 = pos - p.length, count = std::min(kTileTokens, to - pos + 1);
        for (int half = 0; half < g.halves(); ++half) {
          k[half] = TileSource{};
          v[half] = TileSource{};
          for (int t = 0; t < count; ++t) {
            k[half].rows[t] = query.extra_k.at(e0 + t, head) + half * kMaxTileChannels;
            v[half].rows[t] = query.extra_v.at(e0 + t, head) + half * kMaxTileChannels;
          }
        }
        segment(k, v, 0, count, s);
        pos += count;
      }
    }

    if (splits == 1) {
      for (int h = 0; h < group_; ++h) {
        const float sum = s.partials[static_cast<size_t>(h)].sum;
        const float inverse = (sum == 0.0f ? 0.0f : 1.0f / sum) * value_scale_;
        float* out = query.out + (static_cast<size_t>(head) * group_ + h) * d;
        const float* acc = s.acc.data() + static_cast<size_t>(h) * d;
        for (int c = 0; c < d; ++c) out[c] = acc[c] * inverse;
      }
      return;
    }
    std::copy(s.partials.begin(), s.partials.end(), partials_.begin() + static_cast<std::ptrdiff_t>(job * group_));
    std::copy(s.acc.begin(), s.acc.end(), partial_acc_.begin() + static_cast<std::ptrdiff_t>(job * gd));
  }

  /// Queries `r` (consecutive positions of one sequence) over KV head `head`: block by block, the
  /// block's rows gathered once (compressed tiles decoded) and handed with every query's positions
  /// in it to the query-tile kernel. Each query's arithmetic is run_job's with one split.
  void run_tile(const QueryRange& r, int head, Scratch& s) const {
    const PagedGeometry& g = view_.geometry;
    const int d = g.head_dim, n = static_cast<int>(r.end - r.begin), lanes = n * group_;
    const size_t gd = static_cast<size_t>(group_) * d;
    s.q.resize(static_cast<size_t>(n) * gd);
    s.acc.assign(static_cast<size_t>(n) * gd, 0.0f);
    s.max.assign(static_cast<size_t>(lanes), -INFINITY);
    s.sum.assign(static_cast<size_t>(lanes), 0.0f);
    s.ranges.resize(static_cast<size_t>(n));
    s.tiles.resize(static_cast<size_t>(4 * kTileTokens) * g.tile_channels());
    s.tile_scratch.resize(query_tile_scratch_floats(d, lanes));
    for (int i = 0; i < n; ++i) {
      const float* q = queries_[r.begin + static_cast<size_t>(i)].q + static_cast<size_t>(head) * gd;
      float* rounded = s.q.data() + static_cast<size_t>(i) * gd;
      for (size_t c = 0; c < gd; ++c) rounded[c] = bf16_to_float(float_to_bf16(q[c]));
    }
    const QuerySequence& p = sequences_[r.begin];  // the first attended position is the earliest
    const AttentionQuery& rows = queries_[r.begin];  // every query of the range has these extra rows
    const DecodedBlocks* decoded = shared_blocks(rows.sequence);
    const int last = sequences_[r.end - 1].last;
    TileSource k[2], v[2];
    for (int block = p.first / kTileTokens; block <= last / kTileTokens; ++block) {
      const int base = block * kTileTokens;
      const int lo = std::max(p.first, base) - base, hi = std::min(last, base + kTileTokens - 1) - base + 1;
      const int cached_end = std::clamp(p.length - base, lo, hi);  // tokens lo .. cached_end-1 are in the cache
      if (lo < cached_end) {
        block_sources(p, block, head, TensorKind::key, lo, cached_end, k, s, 0, true, decoded);
        block_sources(p, block, head, TensorKind::value, lo, cached_end, v, s, 1, true, decoded);
      }
      for (int t = cached_end; t < hi; ++t) {
        const int e = base + t - p.length;
        for (int half = 0; half < g.halves(); ++half) {
          k[half].rows[t] = rows.extra_k.at(e, head) + half * kMaxTileChannels;
          v[half].rows[t] = rows.extra_v.at(e, head) + half * kMaxTileChannels;
        }
      }
      for (int i = 0; i < n; ++i) {
        const QuerySequence& qp = sequences_[r.begin + static_cast<size_t>(i)];
        s.ranges[static_cast<size_t>(i)] = {std::max(qp.first - base, 0), std::min(qp.last - base + 1, kTileTokens)};
      }
      QueryTileTask task{k, v, g.halves(), g.tile_channels(), lo, hi, group_, key_scale_, n, s.ranges.data(), s.q.data(),
                         s.acc.data(), s.max.data(), s.sum.data(), s.tile_scratch.data()};
      kernels_.query_tile(task);
    }
    for (int j = 0; j < lanes; ++j) {
      const float sum = s.sum[static_cast<size_t>(j)];
      const float inverse = (sum == 0.0f ? 0.0f : 1.0f / sum) * value_scale_;
      const int i = j / group_, h = j % group_;
      float* out = queries_[r.begin + static_cast<size_t>(i)].out + (static_cast<size_t>(head) * group_ + h) * d;
      const float* acc = s.acc.data() + static_cast<size_t>(j) * d;
      for (int c = 0; c < d; ++c) out[c] = acc[c] * inverse;
    }
  }

  /// Combines the ranges of every (query, KV head) in range order: M = max M_i, S = Σ S_i·e^(M_i − M),
  /// acc = Σ acc_i·e^(M_i − M), each sum a chain of fused multiply-adds; empty ranges are skipped.
  void merge() {
    const int heads = view_.geometry.kv_heads, d = view_.geometry.head_dim, splits = o_.splits;
    for (size_t qi = 0; qi < queries_.size(); ++qi) {
      for (int head = 0; head < heads; ++head) {
        for (int h = 0; h < group_; ++h) {
          const size_t first_job = (qi * heads + head) * static_cast<size_t>(splits);
          const auto part = [&](int sp) -> const Partial& { return partials_[(first_job + sp) * group_ + h]; };
          float m = -INFINITY;
          for (int sp = 0; sp < splits; ++sp) m = std::max(m, part(sp).max);
          float* out = queries_[qi].out + (static_cast<size_t>(head) * group_ + h) * d;
          std::vector<float> acc(static_cast<size_t>(d), 0.0f);
          float sum = 0.0f;
          for (int sp = 0; sp < splits; ++sp) {
            if (part(sp).sum == 0.0f && part(sp).max == -INFINITY) continue;
            const float f = std::exp(part(sp).max - m);
            sum = std::fma(part(sp).sum, f, sum);
            const float* a = partial_acc_.data() + ((first_job + sp) * group_ + h) * static_cast<size_t>(d);
            for (int c = 0; c < d; ++c) acc[static_cast<size_t>(c)] = std::fma(a[c], f, acc[static_cast<size_t>(c)]);
          }
          const float inverse = (sum == 0.0f ? 0.0f : 1.0f / sum) * value_scale_;
          for (int c = 0; c < d; ++c) out[c] = acc[static_cast<size_t>(c)] * inverse;
        }
      }
    }
  }

  const KvCache& cache_;
  const PagedCacheView view_;
  const int layer_;
  const std::span<const AttentionQuery> queries_;
  const AttentionOptions& o_;
  const Kernels& kernels_;
  const Fp8Widening* widening_ = nullptr;  ///< an FP8 cache's widening of its codes
  float key_scale_ = 1.0f;                 ///< factor of every score: the softmax scale, times an FP8 layer's K scale
  float value_scale_ = 1.0f;               ///< factor of the output's 1/S: an FP8 layer's V scale (1 otherwise)
  int group_ = 1;
  SequenceTable table_;
  std::vector<QuerySequence> sequences_;
  std::vector<Partial> partials_;
  std::vector<float> partial_acc_;
  /// The decoded blocks of the sequences several query tiles read.
  std::vector<DecodedBlocks> shared_;
};

}  // namespace

void attend_with(const Kernels& kernels, const KvCache& cache, int layer, std::span<const AttentionQuery> queries,
                 const AttentionOptions& options) {
  Runner(cache, layer, queries, options, kernels).run();
}

}  // namespace attention

void attend(const KvCache& cache, int layer, std::span<const AttentionQuery> queries, const AttentionOptions& options) {
  attention::attend_with(attention::best_kernels(), cache, layer, queries, options);
}

}  // namespace gaac
