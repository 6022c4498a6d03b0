// Attention of a forward of several tokens per sequence (or with pad tokens) on the GPU: every query
// made a sequence of its own that shares its sequence's block rows (BatchTable::expand), attended by
// the decode-attention plan and kernel, in chunks of queries whose workspace stays bounded.
#pragma once

#include <cstddef>
#include <vector>

#include "gaac/batch_kv_cache.hpp"
#include "gaac/cuda.hpp"

namespace gaac::cuda::detail {

/// The queries of a batch's running forward attended through DecodePlan: prepare() once per forward,
/// run() per layer. Query i of sequence b attends b's positions up to its own (b's length less the real
/// tokens after it), within each layer's window; a pad query's output is zero.
class ForwardAttention {
 public:
  /// `max_partial_floats` bounds the partial results one launch's workspace holds (0: 2^26, 256 MiB):
  /// the queries are attended in chunks of whole tokens that fit it, one token at least.
  explicit ForwardAttention(size_t max_partial_floats = 0) : max_partial_floats_(max_partial_floats) {}

  /// Expands `batch`'s running forward (a kernel on `stream`) and plans for its queries with `config`
  /// (plan_tokens raised to its longest sequence, so that every chunk is covered). Host work, and
  /// allocations when the forward is larger than any before.
  void prepare(const CacheMemory& cache, const BatchTable& batch, DecodeConfig config, Stream stream);
  /// Attention of layer `layer`: `q` and `out` are `[batch, q_heads, tokens, head_dim]` device arrays
  /// with any strides (channels contiguous), as prepare()'s batch and config. Asynchronous on `stream`.
  void run(const CacheMemory& cache, const BatchTable& batch, int layer, const BatchRows& q,
           const MutableBatchRows& out, float scale, Stream stream) const;

 private:
  BatchTable queries_;               ///< every query of the forward (BatchTable::expand)
  std::vector<BatchTable> chunks_;   ///< slices of queries_: whole tokens of every sequence
  size_t max_partial_floats_ = 0;
  int chunk_tokens_ = 0;             ///< tokens per chunk (the last may have fewer)
  int q_heads_ = 0;
  DecodePlan plan_;
  DeviceBuffer q_, out_;             ///< a chunk's queries and outputs, `[queries][q_heads][head_dim]`
};

}  // namespace gaac::cuda::detail
