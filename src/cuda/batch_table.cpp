// The sequence table of a batch on the device: uploaded from a host cache's table, or reserved for
// sequences that grow on the device; the host's side of a forward's begin, copies and views. The edits
// (select, truncate) are in edit.cu, the expansion of a forward's queries in forward_attention.cu.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cuda/check.hpp"
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
  cache.require_bf16("BatchTable::reserve");
  if (sequences < 1) throw Error("BatchTable: a batch needs at least one sequence");
  if (max_tokens < 1) throw Error("BatchTable: max_tokens must be at least 1");
  const int blocks = (max_tokens + kTileTokens - 1) / kTileTokens;
  const uint32_t first = cache.take_rows(static_cast<uint32_t>(sequences) * static_cast<uint32_t>(blocks));
  BatchTable batch;
  batch.reserved_blocks_ = blocks;
  for (int s = 0; s < sequences; ++s) batch.first_rows_.push_back(first + static_cast<uint32_t>(s * blocks));
  batch.lay_out(std::vector<int32_t>(static_cast<size_t>(sequences), 0), std::vector<int32_t>(static_cast<size_t>(sequences), 0));
  return batch;
}

void BatchTable::lay_out(const std::vector<int32_t>& lengths, const std::vector<int32_t>& held) {
  const auto n = static_cast<int>(first_rows_.size());
  const int blocks = reserved_blocks_;
  std::vector<int32_t> indptr(static_cast<size_t>(n) + 1);
  std::vector<uint32_t> rows(static_cast<size_t>(n) * blocks);
  for (int s = 0; s <= n; ++s) indptr[static_cast<size_t>(s)] = s * blocks;
  for (int s = 0; s < n; ++s)
    for (int b = 0; b < blocks; ++b) rows[static_cast<size_t>(s) * blocks + b] = row_of(s, b);
  const auto fit = [](DeviceBuffer& buffer, size_t bytes) {
    if (buffer.bytes() < bytes) buffer = DeviceBuffer(bytes);
  };
  fit(indptr_, indptr.size() * 4);
  fit(rows_, std::max<size_t>(rows.size(), 1) * 4);
  fit(lengths_buffer_, static_cast<size_t>(n) * 4);
  fit(held_buffer_, static_cast<size_t>(n) * 4);
  fit(counts_buffer_, static_cast<size_t>(n) * 4);
  fit(scratch_rows_, (rows.size() + static_cast<size_t>(n)) * 4);  // count/16 + 1 per sequence
  indptr_.upload(indptr.data(), indptr.size() * 4);
  rows_.upload(rows.data(), rows.size() * 4);
  lengths_buffer_.upload(lengths.data(), lengths.size() * 4);
  held_buffer_.upload(held.data(), held.size() * 4);
  lengths_ = lengths;
  held_ = held;
  blocks_.assign(static_cast<size_t>(n), blocks);
  total_blocks_ = n * blocks;
  view_ = {n, static_cast<const int32_t*>(indptr_.data()), static_cast<const uint32_t*>(rows_.data()),
           static_cast<int32_t*>(lengths_buffer_.data())};
  end_forward();
}

uint32_t BatchTable::block_row(int s, int block) const {
  if (reserved_blocks_ == 0) throw Error("BatchTable::block_row: needs a batch made by BatchTable::reserve");
  if (s < 0 || s >= sequences() || block < 0 || block >= reserved_blocks_)
    throw Error("BatchTable::block_row: sequence " + std::to_string(s) + ", block " + std::to_string(block) + " out of range");
  return row_of(s, block);
}

void BatchTable::end_forward() {
  last_count_ = 0;
  counts_.clear();
  ranks_.clear();
  unattended_ = false;
}

BatchTable BatchTable::clone() const {
  if (rows_.data() == nullptr && view_.rows != nullptr)
    throw Error("BatchTable::clone: an expanded or sliced table views another's rows; clone that one");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  BatchTable copy;
  copy.lengths_ = lengths_, copy.blocks_ = blocks_, copy.held_ = held_, copy.counts_ = counts_, copy.ranks_ = ranks_;
  copy.total_blocks_ = total_blocks_, copy.last_count_ = last_count_, copy.unattended_ = unattended_;
  copy.reserved_blocks_ = reserved_blocks_, copy.first_rows_ = first_rows_, copy.spare_ = spare_;
  copy.indptr_ = indptr_.copy(), copy.rows_ = rows_.copy(), copy.lengths_buffer_ = lengths_buffer_.copy();
  copy.scratch_rows_ = scratch_rows_.copy(), copy.held_buffer_ = held_buffer_.copy();
  copy.counts_buffer_ = counts_buffer_.copy(), copy.ranks_buffer_ = ranks_buffer_.copy();
  const auto own = [](const DeviceBuffer& mine, const DeviceBuffer& theirs, const void* pointer) -> void* {
    // A pointer into `theirs` (or null) as the same place in `mine`.
    if (pointer == nullptr) return nullptr;
    return static_cast<char*>(mine.data()) + (static_cast<const char*>(pointer) - static_cast<const char*>(theirs.data()));
  };
  copy.view_ = {view_.sequences, static_cast<const int32_t*>(own(copy.indptr_, indptr_, view_.indptr)),
                static_cast<const uint32_t*>(own(copy.rows_, rows_, view_.rows)),
                static_cast<int32_t*>(own(copy.lengths_buffer_, lengths_buffer_, view_.lengths))};
  return copy;
}

DeviceForwardView BatchTable::forward_view() const {
  DeviceForwardView f;
  f.tokens = last_count_;
  if (!ranks_.empty()) {
    f.counts = static_cast<const int32_t*>(counts_buffer_.data());
    f.ranks = static_cast<const int32_t*>(ranks_buffer_.data());
  }
  f.held = static_cast<int32_t*>(held_buffer_.data());
  f.unattended = unattended_ ? 1 : 0;
  return f;
}

void BatchTable::note_begin(int count) { note_begin(count, {}, !unattended_); }

void BatchTable::note_begin(int tokens, std::span<const uint8_t> valid, bool attended) {
  if (tokens < 1) throw Error("begin_tokens: a forward adds at least one token, got " + std::to_string(tokens));
  const int n = sequences();
  if (!valid.empty() && valid.size() != static_cast<size_t>(n) * tokens)
    throw Error("begin_tokens: " + std::to_string(valid.size()) + " token flags for a batch of " + std::to_string(n) +
                " sequences of " + std::to_string(tokens) + " tokens");
  const bool pads = std::find(valid.begin(), valid.end(), 0) != valid.end();
  std::vector<int32_t> counts(static_cast<size_t>(n), tokens), ranks;
  if (pads) {
    ranks.resize(valid.size());
    for (int s = 0; s < n; ++s) {
      int rank = 0;
      for (int j = 0; j < tokens; ++j) {
        const size_t at = static_cast<size_t>(s) * tokens + j;
        ranks[at] = valid[at] != 0 ? rank++ : -1;
      }
      counts[static_cast<size_t>(s)] = rank;
    }
  }
  for (int s = 0; s < n; ++s) {
    const int count = counts[static_cast<size_t>(s)];
    if (length(s) + count > capacity(s))
      throw Error(ErrorCode::out_of_space, "begin_tokens: sequence " + std::to_string(s) + " holds " +
                                               std::to_string(length(s)) + " tokens and has room for " +
                                               std::to_string(capacity(s)) + "; " + std::to_string(count) +
                                               " more do not fit");
  }
  unattended_ = !attended;
  held_.resize(lengths_.size(), 0);
  for (int s = 0; s < n; ++s) {
    int32_t& len = lengths_[static_cast<size_t>(s)];
    const int count = counts[static_cast<size_t>(s)];
    const int keep = unattended_ ? len + count : len + (count > 0 ? 1 : 0);  // as grow.cu's held_after
    held_[static_cast<size_t>(s)] = std::max(held_[static_cast<size_t>(s)], keep);
    len += count;
  }
  last_count_ = tokens;
  counts_ = std::move(counts);
  ranks_ = std::move(ranks);
}

void BatchTable::upload_forward(Stream stream) {
  if (ranks_.empty()) return;
  if (ranks_buffer_.bytes() < ranks_.size() * 4) ranks_buffer_ = DeviceBuffer(ranks_.size() * 4);
  if (counts_buffer_.bytes() < counts_.size() * 4) counts_buffer_ = DeviceBuffer(counts_.size() * 4);
  check(cudaMemcpyAsync(counts_buffer_.data(), counts_.data(), counts_.size() * 4, cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync");
  check(cudaMemcpyAsync(ranks_buffer_.data(), ranks_.data(), ranks_.size() * 4, cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync");
}

int BatchTable::attended_blocks(int s, int window) const {
  const int len = length(s);
  if (len <= 0) return 0;
  const int first = first_attended(len - 1, window) / kTileTokens;
  return std::min(blocks(s), (len + kTileTokens - 1) / kTileTokens) - first;
}

BatchTable BatchTable::slice(int first, int count) const {
  if (first < 0 || count < 1 || first + count > sequences())
    throw Error("BatchTable::slice: sequences " + std::to_string(first) + " + " + std::to_string(count) +
                " out of range for " + std::to_string(sequences()));
  BatchTable part;
  part.lengths_.assign(lengths_.begin() + first, lengths_.begin() + first + count);
  part.blocks_.assign(blocks_.begin() + first, blocks_.begin() + first + count);
  part.total_blocks_ = total_blocks_;
  part.view_ = {count, view_.indptr + first, view_.rows, view_.lengths + first};
  return part;
}

}  // namespace gaac::cuda
