// The CPU batch cache: a gaac::KvCache holding the batch's sequences, attended by gaac::attend. A
// forward's real rows (pads dropped) are copied as its layers write them and appended, every layer at
// once, when the next forward begins or the batch is edited: until then attention reads them beside the
// cache (positions after the cached ones, the same bits as reading them from it), so that every query of
// a long forward still sees the positions its sliding window needs, which appending would release.
// Edits are KvCache's: select() forks, truncate() truncates, clone() clones.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gaac/batch_kv_cache.hpp"
#include "gaac/bf16.hpp"
#include "gaac/error.hpp"

namespace gaac {

BatchKvCache::~BatchKvCache() = default;

namespace {

/// Throws unless `rows` is `[batch, heads, tokens, head_dim]` with contiguous channels.
void check_rows(const BatchRows& rows, int batch, int heads, int tokens, int head_dim, const char* what) {
  if (rows.data == nullptr || rows.batch != batch || rows.heads != heads || rows.tokens != tokens ||
      rows.head_dim != head_dim)
    throw Error(std::string(what) + " must be [" + std::to_string(batch) + ", " + std::to_string(heads) + ", " +
                std::to_string(tokens) + ", " + std::to_string(head_dim) + "], got [" + std::to_string(rows.batch) +
                ", " + std::to_string(rows.heads) + ", " + std::to_string(rows.tokens) + ", " +
                std::to_string(rows.head_dim) + "]");
}

class HostBatchKvCache final : public BatchKvCache {
 public:
  explicit HostBatchKvCache(const BatchCacheConfig& config)
      : BatchKvCache(config.batch, config.cache.geometry.layers), cache_(config.cache), path_(config.path) {
    if (config.batch < 1) throw Error("a batch cache needs at least one sequence, got " + std::to_string(config.batch));
    for (int b = 0; b < config.batch; ++b) ids_.push_back(cache_.add_sequence());
    pending_.resize(static_cast<size_t>(layers()));
    written_.assign(static_cast<size_t>(layers()), false);
    end_forward();
  }

  void begin(int tokens, std::span<const uint8_t> valid, CUstream_st*, bool) override {
    check_in_step("begin");
    if (tokens < 1) throw Error("begin: a forward adds at least one token, got " + std::to_string(tokens));
    if (!valid.empty() && valid.size() != static_cast<size_t>(batch()) * tokens)
      throw Error("begin: " + std::to_string(valid.size()) + " token flags for a batch of " + std::to_string(batch()) +
                  " sequences of " + std::to_string(tokens) + " tokens");
    check_between("begin");
    if (pending()) commit();
    tokens_ = tokens;
    valid_.assign(valid.begin(), valid.end());
    offsets_.assign(static_cast<size_t>(batch()) + 1, 0);
    for (int b = 0; b < batch(); ++b) {
      int count = tokens;
      if (!valid_.empty()) count = static_cast<int>(std::count_if(valid_.begin() + b * tokens, valid_.begin() + (b + 1) * tokens,
                                                                  [](uint8_t f) { return f != 0; }));
      offsets_[static_cast<size_t>(b) + 1] = offsets_[static_cast<size_t>(b)] + count;
    }
    committed_ = false;
    written_.assign(written_.size(), false);
  }

  void write(int layer, const BatchRows& k, const BatchRows& v, CUstream_st*) override {
    check_layer(layer, "write");
    if (written_[static_cast<size_t>(layer)]) throw Error("write: layer " + std::to_string(layer) + " written twice");
    const PagedGeometry& g = cache_.geometry();
    check_rows(k, batch(), g.kv_heads, tokens_, g.head_dim, "write: k");
    check_rows(v, batch(), g.kv_heads, tokens_, g.head_dim, "write: v");
    // The real tokens' rows, copied as [K, V][sequence][its real tokens][kv_heads][head_dim]: the caller's
    // tensors need not outlive the call.
    std::vector<uint16_t>& rows = pending_[static_cast<size_t>(layer)];
    const size_t per_kind = static_cast<size_t>(offsets_.back()) * g.kv_heads * g.head_dim;
    rows.resize(2 * per_kind);
    size_t at = 0;
    for (const BatchRows* src : {&k, &v}) {
      for (int b = 0; b < batch(); ++b)
        for (int t = 0; t < tokens_; ++t) {
          if (!real(b, t)) continue;
          for (int h = 0; h < g.kv_heads; ++h, at += static_cast<size_t>(g.head_dim)) {
            const uint16_t* from = src->at(b, h, t);
            std::copy(from, from + g.head_dim, rows.begin() + static_cast<std::ptrdiff_t>(at));
          }
        }
    }
    written_[static_cast<size_t>(layer)] = true;
  }

  void attend(int layer, const BatchRows& q, const MutableBatchRows& out, float scale, CUstream_st*) override {
    check_layer(layer, "attend");
    if (!written_[static_cast<size_t>(layer)])
      throw Error("attend: layer " + std::to_string(layer) + " has not written this forward's rows");
    const int d = cache_.geometry().head_dim;
    check_rows(q, batch(), q.heads, tokens_, d, "attend: q");
    check_rows(BatchRows{out.data, out.batch, out.heads, out.tokens, out.head_dim}, batch(), q.heads, tokens_, d,
               "attend: out");
    const size_t per_query = static_cast<size_t>(q.heads) * d;
    std::vector<float> q_float(static_cast<size_t>(batch()) * tokens_ * per_query);
    std::vector<float> out_float(q_float.size(), 0.0f);
    std::vector<AttentionQuery> queries;
    for (int b = 0; b < batch(); ++b) {
      int position = cache_.length(ids_[static_cast<size_t>(b)]);
      for (int t = 0; t < tokens_; ++t) {
        if (!real(b, t)) continue;  // a pad: no query, its output stays zero
        float* qf = q_float.data() + (static_cast<size_t>(b) * tokens_ + t) * per_query;
        for (int h = 0; h < q.heads; ++h) {
          const uint16_t* row = q.at(b, h, t);
          for (int c = 0; c < d; ++c) qf[static_cast<size_t>(h) * d + c] = bf16_to_float(row[c]);
        }
        AttentionQuery query{ids_[static_cast<size_t>(b)], position++, qf,
                             out_float.data() + (static_cast<size_t>(b) * tokens_ + t) * per_query, {}, {}};
        query.extra_k = pending_view(layer, 0, b);  // the forward's rows, beside the cache
        query.extra_v = pending_view(layer, 1, b);
        queries.push_back(query);
      }
    }
    AttentionOptions options;
    options.q_heads = q.heads;
    options.scale = scale > 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(d));
    options.path = path_;
    gaac::attend(cache_, layer, queries, options);
    for (int b = 0; b < batch(); ++b)
      for (int t = 0; t < tokens_; ++t)
        for (int h = 0; h < q.heads; ++h) {
          const float* from = out_float.data() + (static_cast<size_t>(b) * tokens_ + t) * per_query +
                              static_cast<size_t>(h) * d;
          uint16_t* to = out.at(b, h, t);
          for (int c = 0; c < d; ++c) to[c] = float_to_bf16(from[c]);
        }
  }

  int length(int sequence) const override {
    check_sequence(sequence, "length");
    return cache_.length(ids_[static_cast<size_t>(sequence)]) + (committed_ ? 0 : forward_count(sequence));
  }
  int forward_tokens() const override { return tokens_; }

  void select(std::span<const int> sources) override {
    check_in_step("select");
    check_between("select");
    if (sources.empty()) throw Error("select: a batch keeps at least one sequence");
    for (const int s : sources) check_sequence(s, "select");
    if (pending()) commit();
    std::vector<SequenceId> chosen;
    std::vector<bool> used(ids_.size(), false);
    for (const int s : sources) {
      const SequenceId id = ids_[static_cast<size_t>(s)];
      if (!used[static_cast<size_t>(s)]) {
        used[static_cast<size_t>(s)] = true;
        chosen.push_back(id);
        continue;
      }
      SequenceId child = 0;
      if (cache_.fork(id, child) != CacheStatus::ok) {
        for (size_t i = 0; i < chosen.size(); ++i)  // the forks made so far go; the batch is as it was
          if (std::find(ids_.begin(), ids_.end(), chosen[i]) == ids_.end()) cache_.free_sequence(chosen[i]);
        throw Error(ErrorCode::out_of_space, "the KV cache's budget is full: forking sequence " + std::to_string(s) +
                                                 " needs room for a copy of its open block; the cache is unchanged");
      }
      chosen.push_back(child);
    }
    for (size_t s = 0; s < ids_.size(); ++s)
      if (!used[s]) cache_.free_sequence(ids_[s]);
    ids_ = std::move(chosen);
    set_batch(static_cast<int>(ids_.size()));
    end_forward();
  }

  void truncate(std::span<const int> lengths) override {
    check_in_step("truncate");
    check_between("truncate");
    if (lengths.size() != ids_.size())
      throw Error("truncate: " + std::to_string(lengths.size()) + " lengths for " + std::to_string(ids_.size()) +
                  " sequences");
    for (int b = 0; b < batch(); ++b)
      if (lengths[static_cast<size_t>(b)] < 0 || lengths[static_cast<size_t>(b)] > length(b))
        throw Error("truncate: sequence " + std::to_string(b) + " holds " + std::to_string(length(b)) +
                    " tokens, cannot be cut back to " + std::to_string(lengths[static_cast<size_t>(b)]));
    if (pending()) commit();
    end_forward();
    for (int b = 0; b < batch(); ++b) {
      try {
        if (cache_.truncate(ids_[static_cast<size_t>(b)], lengths[static_cast<size_t>(b)]) != CacheStatus::ok)
          throw Error(ErrorCode::out_of_space, "the KV cache's budget is full: cutting sequence " + std::to_string(b) +
                                                   " back needs a free unit per compressed tile of its cut block");
      } catch (const Error&) {
        broken_ = b > 0;  // sequences before b were cut; with b = 0 nothing changed
        throw;
      }
    }
  }

  void reset() override {
    for (const SequenceId id : ids_) cache_.free_sequence(id);
    for (SequenceId& id : ids_) id = cache_.add_sequence();
    broken_ = false;
    end_forward();
  }

  std::unique_ptr<BatchKvCache> clone() const override { return std::unique_ptr<BatchKvCache>(new HostBatchKvCache(*this)); }

  CacheUsage usage() const override { return cache_.usage(); }
  void check() const override {}
  void note_replayed(int) override {
    throw Error("note_replayed: CUDA graphs are replayed on a GPU; a CPU cache counts every forward itself");
  }
  bool in_device_memory() const override { return false; }

 private:
  /// A deep copy (clone()).
  HostBatchKvCache(const HostBatchKvCache& other)
      : BatchKvCache(other),
        cache_(other.cache_.clone()),
        path_(other.path_),
        ids_(other.ids_),
        pending_(other.pending_),
        written_(other.written_),
        valid_(other.valid_),
        offsets_(other.offsets_),
        tokens_(other.tokens_),
        committed_(other.committed_),
        broken_(other.broken_) {}

  /// Throws once an operation reached some sequences and not others.
  void check_in_step(const char* what) const {
    if (broken_)
      throw Error(std::string(what) + ": an earlier forward or edit ran out of room after changing some sequences "
                                      "and not others; the batch is inconsistent (make a cache with a larger budget)");
  }

  /// Throws while a forward has begun and not every layer has written.
  void check_between(const char* what) const {
    if (tokens_ > 0 && !complete()) throw Error(std::string(what) + ": the running forward did not write every layer");
  }

  void check_sequence(int sequence, const char* what) const {
    if (sequence < 0 || sequence >= batch())
      throw Error(std::string(what) + ": sequence " + std::to_string(sequence) + " out of range for a batch of " +
                  std::to_string(batch()));
  }

  void check_layer(int layer, const char* what) const {
    check_in_step(what);
    if (layer < 0 || layer >= layers())
      throw Error(std::string(what) + ": layer " + std::to_string(layer) + " out of range for " +
                  std::to_string(layers()) + " layers");
    if (tokens_ == 0) throw Error(std::string(what) + ": no forward has begun");
  }

  /// True when token t of sequence b in the running forward is real (not a pad).
  bool real(int b, int t) const { return valid_.empty() || valid_[static_cast<size_t>(b) * tokens_ + t] != 0; }
  /// Real tokens of sequence b in the running forward.
  int forward_count(int b) const { return offsets_[static_cast<size_t>(b) + 1] - offsets_[static_cast<size_t>(b)]; }

  /// No forward running: the batch was made or edited.
  void end_forward() {
    tokens_ = 0;
    valid_.clear();
    offsets_.assign(static_cast<size_t>(batch()) + 1, 0);
    committed_ = true;
  }

  /// Sequence b's pending rows of `layer` (kind 0: K, 1: V) as a [tokens, kv_heads, head_dim] view.
  KvView pending_view(int layer, int kind, int b) const {
    const PagedGeometry& g = cache_.geometry();
    const size_t token = static_cast<size_t>(g.kv_heads) * g.head_dim;
    const size_t per_kind = static_cast<size_t>(offsets_.back()) * token;
    const uint16_t* data = pending_[static_cast<size_t>(layer)].data() + kind * per_kind +
                           static_cast<size_t>(offsets_[static_cast<size_t>(b)]) * token;
    return {data, forward_count(b), g.kv_heads, g.head_dim, token, static_cast<size_t>(g.head_dim)};
  }

  /// True when every layer has written the running forward's rows.
  bool complete() const { return std::find(written_.begin(), written_.end(), false) == written_.end(); }
  /// True while a complete forward's rows wait beside the cache.
  bool pending() const { return tokens_ > 0 && complete() && !committed_; }

  /// Appends the last forward's real rows of every layer to every sequence.
  void commit() {
    for (int b = 0; b < batch(); ++b) {
      std::vector<KvView> k, v;
      for (int l = 0; l < layers(); ++l) {
        k.push_back(pending_view(l, 0, b));
        v.push_back(pending_view(l, 1, b));
      }
      const AppendOutcome r = cache_.append(ids_[static_cast<size_t>(b)], k, v);
      if (r.status != CacheStatus::ok) {
        broken_ = b > 0;  // sequences before b took the rows; with b = 0 nothing changed
        throw Error(ErrorCode::out_of_space,
                    "the KV cache's budget is full: appending " + std::to_string(forward_count(b)) +
                        " tokens to sequence " + std::to_string(b) + " needs a budget of " +
                        (r.measured ? "" : "at least ") + std::to_string(r.budget_needed) + " bytes" +
                        (b + 1 < batch() ? " (and the sequences after it more)" : "") + "; the budget is " +
                        std::to_string(cache_.usage().budget_bytes) + " bytes" +
                        (b == 0 ? "; the cache is unchanged" : ""));
      }
    }
    committed_ = true;
  }

  KvCache cache_;
  AttentionPath path_;
  std::vector<SequenceId> ids_;
  std::vector<std::vector<uint16_t>> pending_;  ///< per layer: [K, V][sequence][real tokens][kv_heads][head_dim]
  std::vector<bool> written_;
  std::vector<uint8_t> valid_;  ///< the running forward's token flags (empty: every token real)
  std::vector<int> offsets_;    ///< per sequence, its first pending row; offsets_[batch]: all of them
  int tokens_ = 0;              ///< tokens per sequence of the running (or last) forward, pads included
  bool committed_ = true;       ///< the last forward's rows are in the cache
  bool broken_ = false;         ///< an operation reached some sequences and not others
};

}  // namespace

std::unique_ptr<BatchKvCache> make_host_batch_kv_cache(const BatchCacheConfig& config) {
  if (is_fp8(config.cache.format)) {
    throw Error(std::string("a batch KV cache takes BF16 rows: its format must be gaac or bf16, not ") + to_string(config.cache.format));
  }
  return std::make_unique<HostBatchKvCache>(config);
}

}  // namespace gaac
