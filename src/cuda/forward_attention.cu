// A forward's queries as sequences of their own (BatchTable::expand), and their attention through the
// decode plan: queries gathered into `[queries][q_heads][head_dim]`, attended chunk by chunk, outputs
// scattered back (zero for pads). The decode kernel attends each sequence's newest token: a query of
// token i of sequence b is a sequence with b's rows and b's length less the real tokens after i.
#include "cuda/forward_attention.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cuda/check.hpp"
#include "gaac/error.hpp"

namespace gaac::cuda {
namespace {

constexpr int kThreads = 128;

/// The real tokens and the rank of token j of sequence `seq` (−1: a pad) in a forward.
__device__ int count_of(const DeviceForwardView& f, int seq) { return f.counts ? f.counts[seq] : f.tokens; }
__device__ int rank_of(const DeviceForwardView& f, int seq, int j) { return f.ranks ? f.ranks[seq * f.tokens + j] : j; }

/// Entry p of the expanded table: query p / (B+1) of sequence p % (B+1), or a separator (b = B).
__global__ void expand_kernel(const DeviceBatchView batch, const DeviceForwardView forward, int32_t* indptr,
                              int32_t* lengths, int entries) {
  const int p = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (p >= entries) return;
  const int per_token = batch.sequences + 1;
  const int i = p / per_token, b = p % per_token;
  if (p == entries - 1 || b == batch.sequences) {  // a separator, or the end
    indptr[p] = batch.indptr[batch.sequences];
    if (p < entries - 1) lengths[p] = 0;
    return;
  }
  indptr[p] = batch.indptr[b];
  const int rank = rank_of(forward, b, i);
  lengths[p] = rank < 0 ? 0 : batch.lengths[b] - count_of(forward, b) + rank + 1;
}

/// One CTA per (query of the chunk, query head): copies one row of q into the chunk's queries.
__global__ void gather_kernel(const BatchRows q, int first_token, int sequences, uint16_t* to) {
  const int p = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y);
  const int b = p % (sequences + 1), i = first_token + p / (sequences + 1);
  if (b == sequences) return;  // a separator
  const uint16_t* from = q.at(b, h, i);
  uint16_t* row = to + (static_cast<size_t>(p) * q.heads + h) * q.head_dim;
  for (int c = static_cast<int>(threadIdx.x); c < q.head_dim; c += kThreads) row[c] = from[c];
}

/// One CTA per (query of the chunk, query head): copies one output row back (zero for a pad).
__global__ void scatter_kernel(const uint16_t* from, const DeviceForwardView forward, int first_token, int sequences,
                               const MutableBatchRows out) {
  const int p = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y);
  const int b = p % (sequences + 1), i = first_token + p / (sequences + 1);
  if (b == sequences) return;
  const bool pad = rank_of(forward, b, i) < 0;
  const uint16_t* row = from + (static_cast<size_t>(p) * out.heads + h) * out.head_dim;
  uint16_t* to = out.at(b, h, i);
  for (int c = static_cast<int>(threadIdx.x); c < out.head_dim; c += kThreads) to[c] = pad ? uint16_t{0} : row[c];
}

/// Floats of partial results the workspace of one chunk may hold (256 MiB).
constexpr size_t kMaxPartialFloats = size_t{1} << 26;
/// Queries of one launch: the kernel's grid has one z index per sequence (at most 65,535).
constexpr int kMaxQueries = 32768;

}  // namespace

void BatchTable::expand(const BatchTable& batch, Stream stream) {
  const int sequences = batch.sequences(), tokens = batch.last_count();
  if (tokens < 1) throw Error("BatchTable::expand: the batch has no running forward");
  const int per_token = sequences + 1;
  const auto entries = static_cast<size_t>(tokens) * per_token + 1;
  if (indptr_.bytes() < entries * 4) indptr_ = DeviceBuffer(entries * 4);
  if (lengths_buffer_.bytes() < entries * 4) lengths_buffer_ = DeviceBuffer(entries * 4);
  expand_kernel<<<static_cast<unsigned>((entries + 127) / 128), 128, 0, stream>>>(
      batch.view(), batch.forward_view(), static_cast<int32_t*>(indptr_.data()),
      static_cast<int32_t*>(lengths_buffer_.data()), static_cast<int>(entries));
  check(cudaGetLastError(), "BatchTable::expand launch");
  lengths_.assign(entries - 1, 0);
  blocks_.assign(entries - 1, 0);
  for (int b = 0; b < sequences; ++b) {
    const int before = batch.length(b) - batch.last_real(b);
    int rank = 0;
    for (int i = 0; i < tokens; ++i) {
      const bool real = batch.ranks_.empty() || batch.ranks_[static_cast<size_t>(b) * tokens + i] >= 0;
      const auto p = static_cast<size_t>(i) * per_token + b;
      lengths_[p] = real ? before + ++rank : 0;
      blocks_[p] = batch.blocks(b);
    }
  }
  total_blocks_ = batch.total_blocks();
  view_ = {static_cast<int>(entries - 1), static_cast<const int32_t*>(indptr_.data()), batch.view().rows,
           static_cast<int32_t*>(lengths_buffer_.data())};
}

namespace detail {

void ForwardAttention::prepare(const CacheMemory& cache, const BatchTable& batch, DecodeConfig config, Stream stream) {
  queries_.expand(batch, stream);
  const int per_token = batch.sequences() + 1, tokens = batch.last_count();
  int longest = 1;
  for (int b = 0; b < batch.sequences(); ++b) longest = std::max(longest, batch.length(b));
  const PagedGeometry& geo = cache.geometry();
  // Chunks of whole tokens whose partial results fit the bound: splits per query as planned for a
  // fixed split (one for a planned one: the plan then spreads one wave over all the queries).
  const int blocks = (longest + kTileTokens - 1) / kTileTokens;
  const size_t splits = config.blocks_per_split > 0
                            ? std::min<size_t>(1024, (blocks + config.blocks_per_split - 1) / config.blocks_per_split)
                            : 1;
  const size_t per_query = splits * static_cast<size_t>(config.q_heads) * geo.head_dim;
  const size_t bound = max_partial_floats_ > 0 ? max_partial_floats_ : kMaxPartialFloats;
  const auto most = static_cast<int>(std::clamp<size_t>(bound / per_query, 1, kMaxQueries));
  chunk_tokens_ = std::clamp(most / per_token, 1, tokens);
  chunks_.clear();
  for (int first = 0; first < tokens; first += chunk_tokens_)
    chunks_.push_back(queries_.slice(first * per_token, std::min(chunk_tokens_, tokens - first) * per_token));
  config.plan_tokens = std::max(config.plan_tokens, longest);
  plan_.plan(cache, chunks_.front(), config);
  q_heads_ = config.q_heads;
  const size_t bytes = static_cast<size_t>(chunks_.front().sequences()) * config.q_heads * geo.head_dim * 2;
  if (q_.bytes() < bytes) {
    q_ = DeviceBuffer(bytes);
    out_ = DeviceBuffer(bytes);
    check(cudaMemset(q_.data(), 0, bytes), "cudaMemset");  // separators' queries: never read, but defined
  }
}

void ForwardAttention::run(const CacheMemory& cache, const BatchTable& batch, int layer, const BatchRows& q,
                           const MutableBatchRows& out, float scale, Stream stream) const {
  if (chunks_.empty() || q.heads != q_heads_) throw Error("ForwardAttention: not prepared for these queries");
  const int sequences = batch.sequences();
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const BatchTable& chunk = chunks_[c];
    const dim3 grid(static_cast<unsigned>(chunk.sequences()), static_cast<unsigned>(q.heads));
    const int first_token = static_cast<int>(c) * chunk_tokens_;
    auto* qs = static_cast<uint16_t*>(q_.data());
    auto* outs = static_cast<uint16_t*>(out_.data());
    gather_kernel<<<grid, kThreads, 0, stream>>>(q, first_token, sequences, qs);
    check(cudaGetLastError(), "gather_kernel launch");
    plan_.run(cache, chunk, layer, qs, outs, scale, stream);
    scatter_kernel<<<grid, kThreads, 0, stream>>>(outs, batch.forward_view(), first_token, sequences, out);
    check(cudaGetLastError(), "scatter_kernel launch");
  }
}

}  // namespace detail
}  // namespace gaac::cuda
