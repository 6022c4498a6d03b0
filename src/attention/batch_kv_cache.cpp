// The CPU batch cache: a gaac::KvCache holding the batch's sequences, attended by gaac::attend. A
// forward's rows are copied as its layers write them and appended, every layer at once, when the next
// forward begins: until then attention reads them beside the cache (positions after the cached ones,
// the same bits as reading them from it), so that every query of a long forward still sees the
// positions its sliding window needs, which appending would release.
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
  }

  void begin(int tokens, CUstream_st*) override {
    check_in_step("begin");
    if (tokens < 1) throw Error("begin: a forward adds at least one token, got " + std::to_string(tokens));
    if (tokens_ > 0 && !complete()) throw Error("begin: the previous forward did not write every layer");
    if (pending()) commit();
    tokens_ = tokens;
    committed_ = false;
    written_.assign(written_.size(), false);
  }

  void write(int layer, const BatchRows& k, const BatchRows& v, CUstream_st*) override {
    check_layer(layer, "write");
    if (written_[static_cast<size_t>(layer)]) throw Error("write: layer " + std::to_string(layer) + " written twice");
    const PagedGeometry& g = cache_.geometry();
    check_rows(k, batch(), g.kv_heads, tokens_, g.head_dim, "write: k");
    check_rows(v, batch(), g.kv_heads, tokens_, g.head_dim, "write: v");
    // Copied as [K, V][batch][tokens][kv_heads][head_dim]: the caller's tensors need not outlive the call.
    std::vector<uint16_t>& rows = pending_[static_cast<size_t>(layer)];
    const size_t per_kind = static_cast<size_t>(batch()) * tokens_ * g.kv_heads * g.head_dim;
    rows.resize(2 * per_kind);
    size_t at = 0;
    for (const BatchRows* src : {&k, &v}) {
      for (int b = 0; b < batch(); ++b)
        for (int t = 0; t < tokens_; ++t)
          for (int h = 0; h < g.kv_heads; ++h, at += static_cast<size_t>(g.head_dim)) {
            const uint16_t* from = src->at(b, h, t);
            std::copy(from, from + g.head_dim, rows.begin() + static_cast<std::ptrdiff_t>(at));
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
    std::vector<float> out_float(q_float.size());
    std::vector<AttentionQuery> queries;
    const int start = length() - tokens_;
    for (int b = 0; b < batch(); ++b) {
      for (int t = 0; t < tokens_; ++t) {
        float* qf = q_float.data() + (static_cast<size_t>(b) * tokens_ + t) * per_query;
        for (int h = 0; h < q.heads; ++h) {
          const uint16_t* row = q.at(b, h, t);
          for (int c = 0; c < d; ++c) qf[static_cast<size_t>(h) * d + c] = bf16_to_float(row[c]);
        }
        AttentionQuery query{ids_[static_cast<size_t>(b)], start + t, qf,
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

  int length() const override { return cache_.length(ids_.front()) + (committed_ ? 0 : tokens_); }
  int forward_tokens() const override { return tokens_; }
  CacheUsage usage() const override { return cache_.usage(); }
  void check() const override {}
  void note_replayed(int) override {
    throw Error("note_replayed: CUDA graphs are replayed on a GPU; a CPU cache counts every forward itself");
  }
  bool in_device_memory() const override { return false; }

 private:
  /// Throws once a forward reached some sequences and not others.
  void check_in_step(const char* what) const {
    if (broken_)
      throw Error(std::string(what) + ": an earlier forward ran out of room after some sequences took its tokens; "
                                      "the batch is no longer in step (make a cache with a larger budget)");
  }

  void check_layer(int layer, const char* what) const {
    check_in_step(what);
    if (layer < 0 || layer >= layers())
      throw Error(std::string(what) + ": layer " + std::to_string(layer) + " out of range for " +
                  std::to_string(layers()) + " layers");
    if (tokens_ == 0) throw Error(std::string(what) + ": no forward has begun");
  }

  /// Sequence b's pending rows of `layer` (kind 0: K, 1: V) as a [tokens, kv_heads, head_dim] view.
  KvView pending_view(int layer, int kind, int b) const {
    const PagedGeometry& g = cache_.geometry();
    const size_t token = static_cast<size_t>(g.kv_heads) * g.head_dim;
    const size_t per_kind = static_cast<size_t>(batch()) * tokens_ * token;
    const uint16_t* data = pending_[static_cast<size_t>(layer)].data() + kind * per_kind + b * tokens_ * token;
    return {data, tokens_, g.kv_heads, g.head_dim, token, static_cast<size_t>(g.head_dim)};
  }

  /// True when every layer has written the running forward's rows.
  bool complete() const { return std::find(written_.begin(), written_.end(), false) == written_.end(); }
  /// True while a complete forward's rows wait beside the cache.
  bool pending() const { return tokens_ > 0 && complete() && !committed_; }

  /// Appends the last forward's rows of every layer to every sequence.
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
        throw Error(ErrorCode::out_of_space, "the KV cache's budget is full: appending " + std::to_string(tokens_) +
                                                 " tokens to sequence " + std::to_string(b) + " needs " +
                                                 std::to_string(r.bytes_needed) + " bytes, " +
                                                 std::to_string(r.bytes_free) + " are free" +
                                                 (b == 0 ? "; the cache is unchanged" : ""));
      }
    }
    committed_ = true;
  }

  KvCache cache_;
  AttentionPath path_;
  std::vector<SequenceId> ids_;
  std::vector<std::vector<uint16_t>> pending_;  ///< per layer: [K, V][batch][tokens][kv_heads][head_dim]
  std::vector<bool> written_;
  int tokens_ = 0;     ///< tokens of the running (or last) forward
  bool committed_ = false;  ///< the last forward's rows are in the cache
  bool broken_ = false;     ///< a forward reached some sequences and not others
};

}  // namespace

std::unique_ptr<BatchKvCache> make_host_batch_kv_cache(const BatchCacheConfig& config) {
  return std::make_unique<HostBatchKvCache>(config);
}

}  // namespace gaac
