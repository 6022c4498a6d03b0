// The KV cache of a batch of sequences as a model's forward passes use it, on whichever device the
// model runs: a forward of n new tokens per sequence begins, then each layer writes its K and V rows
// and attends its queries. One interface, two implementations: the CPU one keeps the sequences in a
// gaac::KvCache and attends with gaac::attend; the CUDA one (gaac::cuda::make_device_batch_kv_cache,
// include/gaac/cuda.hpp) keeps them in device memory, grows them there and attends with the fused
// decode kernel.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "gaac/attention.hpp"
#include "gaac/export.h"
#include "gaac/kv_cache.hpp"

struct CUstream_st;

namespace gaac {

/// A BF16 tensor `[batch, heads, tokens, head_dim]` with any strides (in elements) and contiguous
/// channels, in host or device memory (where the cache lives): element (b, h, t, c) is
/// `data[b·batch_stride + h·head_stride + t·token_stride + c]` — transformers' layout of key, value and
/// query states. `Element` is `const uint16_t` (read) or `uint16_t` (write).
template <class Element>
struct BasicBatchRows {
  Element* data = nullptr;
  int batch = 0;
  int heads = 0;
  int tokens = 0;
  int head_dim = 0;
  int64_t batch_stride = 0;
  int64_t head_stride = 0;
  int64_t token_stride = 0;

  /// The first channel of (b, h, t).
  constexpr Element* at(int b, int h, int t) const {
    return data + b * batch_stride + h * head_stride + t * token_stride;
  }
};
/// Rows read by the cache.
using BatchRows = BasicBatchRows<const uint16_t>;
/// Rows the cache writes (attention outputs).
using MutableBatchRows = BasicBatchRows<uint16_t>;

/// What a batch cache is made of.
struct BatchCacheConfig {
  CacheConfig cache;         ///< geometry, format, budget, calibration
  int batch = 1;             ///< sequences (select() may change it)
  int max_tokens = 4096;     ///< tokens per sequence the cache makes room for in its tables
  AttentionPath path = AttentionPath::fused;  ///< CPU: how compressed tiles are read
  /// CUDA: 16-token blocks per CTA of decode attention (0: planned for the GPU). A GAAC and a BF16 cache
  /// of the same values give the same bits with the same value.
  int blocks_per_split = 0;
  /// CUDA: plan decode attention as if the sequences had at least this many tokens (0: their lengths),
  /// so that a step captured in a CUDA graph stays right while they grow up to it.
  int plan_tokens = 0;
};

/// The KV cache of one batch of sequences, grown by forward passes. A forward is begin(n), then for
/// every layer write() and (after it) attend(). A forward's n tokens per sequence may include pad tokens
/// (a left-padded batch, or sequences given prompts of different lengths): they are never stored nor
/// attended, so each sequence holds its own real tokens only and grows at its own pace; length(b) counts
/// them. (Where a forward's rows are held meanwhile is the implementation's affair: the CPU one appends
/// them to its KvCache when the next forward begins or the batch is edited, the CUDA one writes them into
/// the device tails at once and finalizes the blocks they complete after the last layer's write().)
/// Between forwards the batch can be edited: select() (beam search, a batch's rows picked or repeated,
/// by forks), truncate() (speculative tokens taken back), reset(), clone(). Errors are gaac::Error
/// (ErrorCode::out_of_space when the budget runs out). Not thread-safe.
class GAAC_API BatchKvCache {
 public:
  virtual ~BatchKvCache();

  /// Starts a forward of `tokens` new tokens per sequence; the previous forward must have written
  /// every layer. `valid` is empty (every token real) or batch() × `tokens` flags, sequence after
  /// sequence: 0 marks a pad token, whose rows write() ignores and whose attention output is zero; a
  /// sequence's real tokens take its next positions, in order. `attended` false says the forward's
  /// queries are attended elsewhere (a prompt over its own rows, a fill): a GPU cache then keeps, in
  /// sliding-window layers, only what its newest token sees, and attend() raises where a query would
  /// need more; the CPU cache, which keeps a forward's rows beside it, attends any forward. Throws
  /// gaac::Error (ErrorCode::out_of_space) when the cache cannot hold the tokens: on a GPU the new ones
  /// (unless `stream` is capturing a CUDA graph: see check()), on the CPU the previous forward's, which it
  /// appends now (nothing changes when the first sequence's do not fit).
  virtual void begin(int tokens, std::span<const uint8_t> valid, CUstream_st* stream, bool attended = true) = 0;
  /// The forward's K and V rows of `layer`, `[batch, kv_heads, tokens, head_dim]` (pad tokens' rows ignored).
  virtual void write(int layer, const BatchRows& k, const BatchRows& v, CUstream_st* stream) = 0;
  /// Attention of the forward's queries of `layer` (after its write()), `q` `[batch, q_heads, tokens,
  /// head_dim]`, into `out` `[batch, q_heads, tokens, head_dim]` (any strides): the i-th real query of
  /// sequence b attends to its positions up to length(b) − (its real tokens in the forward) + i, within
  /// the layer's sliding window; a pad query's output is zero. `scale` multiplies every score (0:
  /// 1/sqrt(head_dim)).
  virtual void attend(int layer, const BatchRows& q, const MutableBatchRows& out, float scale,
                      CUstream_st* stream) = 0;
  /// Tokens sequence `sequence` holds, the running forward's real ones included.
  virtual int length(int sequence) const = 0;
  /// Tokens per sequence of the running (or last) forward, pads included (0 once the batch was edited).
  virtual int forward_tokens() const = 0;
  /// Makes the batch `sources.size()` sequences, sequence i holding what sequence sources[i] held: a
  /// sequence's first use keeps it, each further use is a fork (its complete blocks shared, not copied),
  /// and the sequences no one names are freed. Between forwards only (the last one wrote every layer).
  /// Throws out_of_space, changing nothing, when the forks' open blocks do not fit.
  virtual void select(std::span<const int> sources) = 0;
  /// Cuts every sequence b back to its first `lengths[b]` tokens (KvCache::truncate: a block cut inside
  /// becomes a BF16 tail again, bit for bit). Between forwards only. Throws gaac::Error for a length past
  /// a sequence's, or one whose newest token would attend what a sliding window released.
  virtual void truncate(std::span<const int> lengths) = 0;
  /// Empties every sequence (the batch keeps its size): the whole budget is free again.
  virtual void reset() = 0;
  /// A deep copy: the same sequences and contents in memory of its own (on the same device).
  virtual std::unique_ptr<BatchKvCache> clone() const = 0;
  /// Memory and contents (synchronises a device).
  virtual CacheUsage usage() const = 0;
  /// Throws gaac::Error (ErrorCode::out_of_space) when the budget ran out since the cache was made
  /// (synchronises a device; on the CPU a forward that does not fit throws at once, and this does nothing).
  virtual void check() const = 0;
  /// Counts on the host `count` tokens begun by a replay of a captured CUDA graph (whose begin() counted
  /// only the capture), so that length() and plans follow the device. Throws on the CPU.
  virtual void note_replayed(int count) = 0;
  /// True when rows, queries and outputs are CUDA device memory; false for host memory.
  virtual bool in_device_memory() const = 0;
  /// Sequences of the batch.
  int batch() const { return batch_; }
  /// Layers of the model.
  int layers() const { return layers_; }

 protected:
  BatchKvCache(int batch, int layers) : batch_(batch), layers_(layers) {}
  BatchKvCache(const BatchKvCache&) = default;
  /// A batch of `batch` sequences from now on (select()).
  void set_batch(int batch) { batch_ = batch; }

 private:
  int batch_ = 0, layers_ = 0;
};

/// A batch cache in host memory (a gaac::KvCache of `config.batch` sequences, attended by gaac::attend
/// with `config.path`). A forward's rows are copied at write() and appended, every layer at once, when
/// the next forward begins; until then attention reads them beside the cache, with the same bits.
GAAC_API std::unique_ptr<BatchKvCache> make_host_batch_kv_cache(const BatchCacheConfig& config);

}  // namespace gaac
