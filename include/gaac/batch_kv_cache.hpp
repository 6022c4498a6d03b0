// The KV cache of a batch of sequences as a model's forward passes use it, on whichever device the
// model runs: a forward of n new tokens per sequence begins, then each layer writes its K and V rows
// and attends its queries. One interface, two implementations: the CPU one keeps the sequences in a
// gaac::KvCache and attends with gaac::attend; the CUDA one (gaac::cuda::make_device_batch_kv_cache,
// include/gaac/cuda.hpp) keeps them in device memory, grows them there and attends with the fused
// decode kernel.
#pragma once

#include <cstdint>
#include <memory>

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
  int batch = 1;             ///< sequences, growing in lockstep
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
/// every layer write() and (after it) attend(); length() counts the forward's tokens from begin() on.
/// (Where they are held meanwhile is the implementation's affair: the CPU one appends them to its
/// KvCache when the next forward begins, the CUDA one writes them into the device tails at once and
/// finalizes the blocks they complete after the last layer's write().) Errors are gaac::Error
/// (ErrorCode::out_of_space when the budget runs out). Not thread-safe.
class GAAC_API BatchKvCache {
 public:
  virtual ~BatchKvCache();

  /// Starts a forward of `tokens` new tokens per sequence; the previous forward must have written
  /// every layer. Throws gaac::Error (ErrorCode::out_of_space) when the cache cannot hold the tokens:
  /// on a GPU the new ones (unless `stream` is capturing a CUDA graph: see check()), on the CPU the
  /// previous forward's, which it appends now (nothing changes when the first sequence's do not fit).
  virtual void begin(int tokens, CUstream_st* stream) = 0;
  /// The forward's K and V rows of `layer`, `[batch, kv_heads, tokens, head_dim]`.
  virtual void write(int layer, const BatchRows& k, const BatchRows& v, CUstream_st* stream) = 0;
  /// Attention of the forward's queries of `layer` (after its write()), `q` `[batch, q_heads, tokens,
  /// head_dim]`, into `out` `[batch, q_heads, tokens, head_dim]` (any strides): query i of a sequence
  /// attends to its positions up to length() − tokens + i, within the layer's sliding window. `scale`
  /// multiplies every score (0: 1/sqrt(head_dim)).
  virtual void attend(int layer, const BatchRows& q, const MutableBatchRows& out, float scale,
                      CUstream_st* stream) = 0;
  /// Tokens each sequence holds, the running forward's included.
  virtual int length() const = 0;
  /// Tokens of the running (or last) forward.
  virtual int forward_tokens() const = 0;
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

 private:
  int batch_ = 0, layers_ = 0;
};

/// A batch cache in host memory (a gaac::KvCache of `config.batch` sequences, attended by gaac::attend
/// with `config.path`). A forward's rows are copied at write() and appended, every layer at once, when
/// the next forward begins; until then attention reads them beside the cache, with the same bits.
GAAC_API std::unique_ptr<BatchKvCache> make_host_batch_kv_cache(const BatchCacheConfig& config);

}  // namespace gaac
