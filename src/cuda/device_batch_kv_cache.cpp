// The GPU batch cache: a cache carved on the device, its sequences grown there each by its own real
// tokens, attended by the fused decode kernel with a plan made at the first attention of each forward
// (one query per sequence for a decoding step; every query a sequence of its own for a forward of
// several tokens or with pads: forward_attention.hpp). Edits between forwards are the batch table's
// (select, truncate: edit.cu) and deep copies of the device memory (clone).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "cuda/check.hpp"
#include "cuda/forward_attention.hpp"
#include "gaac/cuda.hpp"

namespace gaac::cuda {
namespace {

/// True while `stream` is capturing a CUDA graph (nothing may synchronise or allocate then).
bool capturing(Stream stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

std::string shape(int a, int b, int c, int d) {
  return "[" + std::to_string(a) + ", " + std::to_string(b) + ", " + std::to_string(c) + ", " + std::to_string(d) + "]";
}

class DeviceBatchKvCache final : public BatchKvCache {
 public:
  explicit DeviceBatchKvCache(const BatchCacheConfig& config)
      : BatchKvCache(config.batch, config.cache.geometry.layers),
        config_(config),
        calibration_(config.cache.calibration != nullptr ? std::make_shared<const CalibrationTable>(*config.cache.calibration)
                                                         : nullptr),
        memory_(CacheMemory::create(config.cache)),
        batch_(BatchTable::reserve(memory_, config.batch, config.max_tokens)),
        budget_bytes_(config.cache.budget_bytes) {
    config_.cache.calibration = calibration_.get();  // the caller's table need not outlive the cache
    decode_.blocks_per_split = config.blocks_per_split;
    decode_.plan_tokens = config.plan_tokens;
    written_.assign(static_cast<size_t>(layers()), false);
  }

  void begin(int tokens, std::span<const uint8_t> valid, CUstream_st* stream, bool attended) override {
    check_between("begin");
    if (!valid.empty() && valid.size() != static_cast<size_t>(batch()) * tokens)
      throw Error("begin: " + std::to_string(valid.size()) + " token flags for a batch of " + std::to_string(batch()) +
                  " sequences of " + std::to_string(tokens) + " tokens");
    begin_tokens(memory_, batch_, tokens, valid, attended, stream);  // throws, changing nothing, past max_tokens
    written_.assign(written_.size(), false);
    ++forwards_;
    if (!capturing(stream)) check();
  }

  void write(int layer, const BatchRows& k, const BatchRows& v, CUstream_st* stream) override {
    check_layer(layer, "write");
    if (written_[static_cast<size_t>(layer)]) throw Error("write: layer " + std::to_string(layer) + " written twice");
    write_tokens(memory_, batch_, layer, token_rows(k, v), stream);
    written_[static_cast<size_t>(layer)] = true;
    if (std::find(written_.begin(), written_.end(), false) == written_.end()) finalize_completed(memory_, batch_, stream);
  }

  void attend(int layer, const BatchRows& q, const MutableBatchRows& out, float scale, CUstream_st* stream) override {
    check_layer(layer, "attend");
    if (!written_[static_cast<size_t>(layer)])
      throw Error("attend: layer " + std::to_string(layer) + " has not written this forward's rows");
    const PagedGeometry& geo = memory_.geometry();
    const int tokens = batch_.last_count();
    const auto fits = [&](const auto& a) {
      return a.data != nullptr && a.batch == batch() && a.heads == q.heads && a.tokens == tokens && a.head_dim == geo.head_dim;
    };
    if (!fits(q) || !fits(out))
      throw Error("attend: q and out must be " + shape(batch(), q.heads, tokens, geo.head_dim) +
                  " device arrays (sequences, query heads, the forward's tokens, head_dim), got q " +
                  shape(q.batch, q.heads, q.tokens, q.head_dim) + " and out " +
                  shape(out.batch, out.heads, out.tokens, out.head_dim));
    const int64_t row = static_cast<int64_t>(q.heads) * geo.head_dim;
    const auto packed = [&](const auto& a) {
      return (a.heads == 1 || a.head_stride == geo.head_dim) && (a.batch == 1 || a.batch_stride == row);
    };
    if (tokens == 1 && batch_.last_uniform() && packed(q) && packed(out)) {  // decoding: one query per sequence
      if (forwards_ != planned_forward_ || decode_.q_heads != q.heads) {
        decode_.q_heads = q.heads;
        plan_.plan(memory_, batch_, decode_);
        planned_forward_ = forwards_;
      }
      plan_.run(memory_, batch_, layer, q.data, out.data, scale, stream);
      return;
    }
    check_unattended_window(layer);
    if (forwards_ != prepared_forward_ || prepared_heads_ != q.heads) {
      DecodeConfig config = decode_;
      config.q_heads = q.heads;
      forward_.prepare(memory_, batch_, config, stream);
      prepared_forward_ = forwards_;
      prepared_heads_ = q.heads;
    }
    forward_.run(memory_, batch_, layer, q, out, scale, stream);
  }

  int length(int sequence) const override {
    if (sequence < 0 || sequence >= batch())
      throw Error("length: sequence " + std::to_string(sequence) + " out of range for a batch of " +
                  std::to_string(batch()));
    return batch_.length(sequence);
  }
  int forward_tokens() const override { return batch_.last_count(); }

  void select(std::span<const int> sources) override {
    check_between("select");
    if (sources.empty()) throw Error("select: a batch keeps at least one sequence");
    bool same = sources.size() == static_cast<size_t>(batch());
    for (size_t i = 0; i < sources.size(); ++i) {
      if (sources[i] < 0 || sources[i] >= batch())
        throw Error("select: sequence " + std::to_string(sources[i]) + " out of range for a batch of " +
                    std::to_string(batch()));
      same = same && sources[i] == static_cast<int>(i);
    }
    if (same) return;
    if (empty()) return remake(static_cast<int>(sources.size()));  // empty sequences: a batch of the new size
    batch_.select(memory_, sources);  // throws, changing nothing, when the forks do not fit
    set_batch(static_cast<int>(sources.size()));
    edited();
  }

  void truncate(std::span<const int> lengths) override {
    check_between("truncate");
    if (lengths.size() != static_cast<size_t>(batch()))
      throw Error("truncate: " + std::to_string(lengths.size()) + " lengths for " + std::to_string(batch()) +
                  " sequences");
    if (std::all_of(lengths.begin(), lengths.end(), [](int n) { return n == 0; })) return reset();
    batch_.truncate(memory_, lengths);
    edited();
  }

  void reset() override { remake(batch()); }

  std::unique_ptr<BatchKvCache> clone() const override {
    return std::unique_ptr<BatchKvCache>(new DeviceBatchKvCache(*this));
  }

  CacheUsage usage() const override {
    const PagedGeometry& geo = memory_.geometry();
    CacheUsage u;
    u.budget_bytes = budget_bytes_;
    u.unit_bytes = geo.unit_bytes;
    u.raw_units = geo.raw_split() ? 2 : 1;
    u.units = memory_.units();
    u.units_free = memory_.free_unit_count();
    u.rows = geo.row_capacity;
    u.rows_used = static_cast<uint64_t>(batch_.total_blocks());
    u.table_bytes = geo.table_entries() * 4;
    // Every tile the sequences' entries hold, once however many forks share it: slots, finalized raw
    // tiles and the open blocks' tails, and the values they hold.
    const std::vector<uint32_t> entries = memory_.entries();
    std::vector<bool> seen(memory_.units(), false);
    uint64_t elements = 0;
    const int tiles = geo.entries_per_layer_row(), channels = geo.tile_channels();
    for (int s = 0; s < batch_.sequences(); ++s) {
      const int len = batch_.length(s);
      for (int block = 0; block * kTileTokens < len; ++block) {
        const uint32_t row = batch_.block_row(s, block);
        const int held = std::min(kTileTokens, len - block * kTileTokens);
        for (int l = 0; l < geo.layers; ++l)
          for (int t = 0; t < tiles; ++t) {
            const uint32_t e = entries[geo.entry_index(l, row, 0, TensorKind::key, 0) + static_cast<size_t>(t)];
            if (entry_class(e) == TileClass::absent || seen[entry_unit(e)]) continue;
            seen[entry_unit(e)] = true;
            elements += static_cast<uint64_t>(held) * channels;
            if (entry_class(e) == TileClass::compressed) ++u.compressed_tiles;
            else if (held < kTileTokens) ++u.tail_tiles;
            else ++u.raw_tiles;
          }
      }
    }
    u.elements = elements;
    u.sequences = static_cast<uint64_t>(batch_.sequences());
    return u;
  }

  void check() const override {
    if (memory_.status() & CacheMemory::kOutOfUnits)
      throw Error(ErrorCode::out_of_space,
                  "the KV cache's budget ran out of units; the tiles begun since then are missing, so the cache's "
                  "contents are incomplete (a larger budget holds more)");
  }

  void note_replayed(int count) override {
    check_between("note_replayed");
    batch_.note_begin(count);
    written_.assign(written_.size(), true);  // the replay wrote every layer
    ++forwards_;
  }
  bool in_device_memory() const override { return true; }

 private:
  /// True while no sequence holds a token.
  bool empty() const {
    for (int b = 0; b < batch(); ++b)
      if (batch_.length(b) != 0) return false;
    return true;
  }

  /// Throws while a forward has begun and not every layer has written.
  void check_between(const char* what) const {
    if (forwards_ > 0 && std::find(written_.begin(), written_.end(), false) != written_.end())
      throw Error(std::string(what) + ": the running forward did not write every layer");
  }

  /// A deep copy (clone()): the device memory and table copied, plans made afresh.
  DeviceBatchKvCache(const DeviceBatchKvCache& other)
      : BatchKvCache(other),
        config_(other.config_),
        calibration_(other.calibration_),
        memory_(other.memory_.clone()),
        batch_(other.batch_.clone()),
        budget_bytes_(other.budget_bytes_),
        decode_(other.decode_),
        written_(other.written_),
        forwards_(other.forwards_) {
    config_.cache.calibration = calibration_.get();
  }

  /// After an edit: no forward is running, and the plans are for another batch.
  void edited() {
    written_.assign(written_.size(), true);
    planned_forward_ = -1;
    prepared_forward_ = -1;
  }

  /// Throws when a forward begun unattended (it kept only its newest token's windows) is attended
  /// where one of its queries would need a block its sliding window let go.
  void check_unattended_window(int layer) const {
    const int window = memory_.window(layer);
    if (!batch_.last_unattended() || window == 0) return;
    for (int b = 0; b < batch(); ++b) {
      const int count = batch_.last_real(b), len = batch_.length(b);
      if (count > 0 && first_attended(len - count, window) / kTileTokens < first_attended(len - 1, window) / kTileTokens)
        throw Error("attend: the forward was begun unattended (its queries attended elsewhere), so the GPU cache kept "
                    "only what its newest token sees in layer " + std::to_string(layer) + "'s sliding window of " +
                    std::to_string(window) + " tokens, and sequence " + std::to_string(b) + "'s first " +
                    std::to_string(count) + " queries need more; begin it attended (begin(..., attended=true))");
    }
  }

  /// The cache made again, empty, for `sequences` sequences: the whole budget free.
  void remake(int sequences) {
    batch_ = BatchTable{};
    memory_ = CacheMemory{};  // the old memory freed before the new is carved
    memory_ = CacheMemory::create(config_.cache);
    batch_ = BatchTable::reserve(memory_, sequences, config_.max_tokens);
    set_batch(sequences);
    written_.assign(written_.size(), false);
    forwards_ = 0;
    planned_forward_ = -1;
    prepared_forward_ = -1;
  }

  void check_layer(int layer, const char* what) const {
    if (layer < 0 || layer >= layers())
      throw Error(std::string(what) + ": layer " + std::to_string(layer) + " out of range for " +
                  std::to_string(layers()) + " layers");
    if (forwards_ == 0) throw Error(std::string(what) + ": no forward has begun");
  }

  /// `[batch, kv_heads, tokens, head_dim]` device rows as write_tokens reads them.
  TokenRows token_rows(const BatchRows& k, const BatchRows& v) const {
    const PagedGeometry& geo = memory_.geometry();
    const int tokens = batch_.last_count();
    for (const BatchRows* a : {&k, &v}) {
      if (a->data == nullptr || a->batch != batch() || a->heads != geo.kv_heads || a->tokens != tokens ||
          a->head_dim != geo.head_dim)
        throw Error("write: k and v must be " + shape(batch(), geo.kv_heads, tokens, geo.head_dim) +
                    " (sequences, KV heads, the forward's tokens, head_dim), got " +
                    shape(a->batch, a->heads, a->tokens, a->head_dim));
    }
    // A dimension of extent 1 may carry any stride: give it one the kernel accepts.
    const auto stride = [](int extent, int64_t given, int64_t otherwise) { return extent == 1 ? otherwise : given; };
    TokenRows r;
    r.k = k.data;
    r.v = v.data;
    r.token_stride = stride(tokens, k.token_stride, geo.head_dim);
    r.head_stride = stride(geo.kv_heads, k.head_stride, r.token_stride * tokens);
    r.sequence_stride = stride(batch(), k.batch_stride, r.head_stride * geo.kv_heads);
    if (stride(tokens, v.token_stride, r.token_stride) != r.token_stride ||
        stride(geo.kv_heads, v.head_stride, r.head_stride) != r.head_stride ||
        stride(batch(), v.batch_stride, r.sequence_stride) != r.sequence_stride)
      throw Error("write: k and v need the same strides");
    return r;
  }

  BatchCacheConfig config_;
  std::shared_ptr<const CalibrationTable> calibration_;  ///< config_'s table, owned (remake() carves with it)
  CacheMemory memory_;
  BatchTable batch_;
  uint64_t budget_bytes_ = 0;
  DecodeConfig decode_;
  DecodePlan plan_;                   ///< decoding steps: one query per sequence
  detail::ForwardAttention forward_;  ///< other forwards: every query a sequence of its own
  std::vector<bool> written_;
  long long forwards_ = 0;           ///< forwards begun (replays counted by note_replayed)
  long long planned_forward_ = -1;   ///< the forward plan_ was made in
  long long prepared_forward_ = -1;  ///< the forward forward_ was prepared for
  int prepared_heads_ = 0;
};

}  // namespace

std::unique_ptr<BatchKvCache> make_device_batch_kv_cache(const BatchCacheConfig& config) {
  if (!device_available()) throw Error("a GPU batch cache needs a CUDA device, and none was found");
  if (config.batch < 1) throw Error("a batch cache needs at least one sequence, got " + std::to_string(config.batch));
  return std::make_unique<DeviceBatchKvCache>(config);
}

}  // namespace gaac::cuda
