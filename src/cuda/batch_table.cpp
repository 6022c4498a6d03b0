// The sequence table of a batch on the device: uploaded from a host cache's table, or reserved for
// sequences that grow on the device.
#include <algorithm>
#include <string>
#include <vector>

#include "gaac/cuda.hpp"
#include "gaac/error.hpp"

namespace gaac::cuda {

BatchTable BatchTable::upload(const SequenceTableView& host) {
  BatchTable batch;
  const int n = host.sequences;
  if (n < 1) throw Error("BatchTable: a batch needs at least one sequence");
  batch.lengths_.assign(host.lengths, host.lengths + n);
  batch.blocks_.resize(static_cast<size_t>(n));
  for (int s = 0; s < n; ++s) {
    batch.blocks_[static_cast<size_t>(s)] = host.indptr[s + 1] - host.indptr[s];
    if (batch.blocks_[static_cast<size_t>(s)] * kTileTokens < host.lengths[s] || host.lengths[s] < 0)
      throw Error("BatchTable: sequence " + std::to_string(s) + " has fewer blocks than its length needs");
  }
  batch.total_blocks_ = host.indptr[n];
  batch.indptr_ = DeviceBuffer(static_cast<size_t>(n + 1) * 4);
  batch.indptr_.upload(host.indptr, static_cast<size_t>(n + 1) * 4);
  batch.rows_ = DeviceBuffer(static_cast<size_t>(std::max(batch.total_blocks_, 1)) * 4);
  batch.rows_.upload(host.rows, static_cast<size_t>(batch.total_blocks_) * 4);
  batch.lengths_buffer_ = DeviceBuffer(static_cast<size_t>(n) * 4);
  batch.lengths_buffer_.upload(host.lengths, static_cast<size_t>(n) * 4);
  batch.view_ = {n, static_cast<const int32_t*>(batch.indptr_.data()), static_cast<const uint32_t*>(batch.rows_.data()),
                 static_cast<int32_t*>(batch.lengths_buffer_.data())};
  return batch;
}

BatchTable BatchTable::reserve(CacheMemory& cache, int sequences, int max_tokens) {
  if (sequences < 1) throw Error("BatchTable: a batch needs at least one sequence");
  if (max_tokens < 1) throw Error("BatchTable: max_tokens must be at least 1");
  const int blocks = (max_tokens + kTileTokens - 1) / kTileTokens;
  const uint32_t first = cache.take_rows(static_cast<uint32_t>(sequences) * static_cast<uint32_t>(blocks));
  std::vector<int32_t> indptr(static_cast<size_t>(sequences) + 1);
  std::vector<uint32_t> rows(static_cast<size_t>(sequences) * blocks);
  for (int s = 0; s <= sequences; ++s) indptr[static_cast<size_t>(s)] = s * blocks;
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = first + static_cast<uint32_t>(i);
  std::vector<int32_t> lengths(static_cast<size_t>(sequences), 0);
  BatchTable batch = upload({sequences, indptr.data(), rows.data(), lengths.data()});
  batch.scratch_rows_ = DeviceBuffer((rows.size() + static_cast<size_t>(sequences)) * 4);  // count/16 + 1 per sequence
  return batch;
}

void BatchTable::note_begin(int count) {
  if (count < 1) throw Error("begin_tokens: count must be at least 1");
  for (int s = 0; s < sequences(); ++s) {
    if (length(s) + count > capacity(s))
      throw Error(ErrorCode::out_of_space, "begin_tokens: sequence " + std::to_string(s) + " holds " +
                                               std::to_string(length(s)) + " tokens and has room for " +
                                               std::to_string(capacity(s)) + "; " + std::to_string(count) +
                                               " more do not fit");
  }
  for (int32_t& len : lengths_) len += count;
  last_count_ = count;
}

int BatchTable::attended_blocks(int s, int window) const {
  const int len = length(s);
  if (len <= 0) return 0;
  const int first = first_attended(len - 1, window) / kTileTokens;
  return std::min(blocks(s), (len + kTileTokens - 1) / kTileTokens) - first;
}

}  // namespace gaac::cuda
