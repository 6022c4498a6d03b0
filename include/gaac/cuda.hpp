// gaac on NVIDIA GPUs (sm_90): the device mirror of a paged cache (docs/format.md, section 13), decode
// attention over it (the fused GAAC kernel, its BF16 twin, decompress-first), finalize of open blocks
// on the device, decompression to dense or paged BF16, and .gaac snapshot encoding from device
// tensors. Host API only: nothing here needs a CUDA compiler, and every function throws gaac::Error on
// a CUDA failure or bad input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gaac/calibration.hpp"
#include "gaac/kv_dump.hpp"
#include "gaac/paged_layout.hpp"

struct CUstream_st;

namespace gaac {
class KvCache;
struct CacheConfig;
}

namespace gaac::cuda {

/// A CUDA stream (cudaStream_t); null is the default stream.
using Stream = CUstream_st*;

/// True when the CUDA runtime finds at least one device (false, never an error, without a driver).
bool device_available();
/// "name, N SMs, compute capability X.Y" of the current device.
std::string device_description();

/// An owning, move-only device allocation from cudaMalloc.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  /// Allocates `bytes` bytes (none for 0).
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  /// Copies `bytes` bytes from host memory at `src` to offset `offset`.
  void upload(const void* src, size_t bytes, size_t offset = 0);
  /// Copies `bytes` bytes from offset `offset` to host memory at `dst`.
  void download(void* dst, size_t bytes, size_t offset = 0) const;

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

/// A paged cache in device memory: its unit pool, block table, bases and per-layer windows, in the
/// layout of the host cache it was copied from.
class DeviceCache {
 public:
  /// Copies a host cache to the device, in its layout: the pool up to its last unit in use (units past
  /// it hold nothing a kernel reads), the whole block table, the bases and the windows. The pool gets
  /// 16 bytes of padding past its last unit: the kernels may read that far.
  static DeviceCache upload(const KvCache& host);
  /// An empty cache made on the device alone, carved from `config`'s budget exactly as a KvCache of
  /// that config is (the same unit size, units, block rows and bases), every unit free and no host
  /// pool. Sequences grow in it on the device: DeviceSequences::reserve, then begin_tokens,
  /// write_tokens and finalize_completed.
  static DeviceCache create(const CacheConfig& config);
  /// An empty BF16 cache of one layer with the given KV heads, head width and rows, one unit for every
  /// entry: what decompress() writes.
  static DeviceCache bf16_for(const PagedGeometry& like, int window);

  /// The device pointers (windows stay on the host: see window()).
  const PagedCacheView& view() const { return view_; }
  /// Sliding window of a layer in tokens (0: full attention).
  int window(int layer) const { return windows_.at(static_cast<size_t>(layer)); }
  /// Units in the pool.
  uint32_t units() const { return units_; }
  /// True for a cache of compressed slots (units smaller than a raw tile); false for a BF16 cache.
  bool compressed() const { return view_.geometry.raw_split(); }
  /// Copies the pool and the block table back to host memory (for tests and tools).
  void download(std::vector<uint8_t>& units, std::vector<uint32_t>& entries) const;
  /// The bases as the decode kernel's lanes read them (one block of words per layer and KV head, made
  /// from the bases at upload); null for a BF16 cache.
  const uint32_t* lane_bases() const { return static_cast<const uint32_t*>(lane_bases_buffer_.data()); }
  /// Writable device pointers of the pool and the table, for kernels that fill the cache.
  uint8_t* units_data() const { return static_cast<uint8_t*>(units_buffer_.data()); }
  uint32_t* entries_data() const { return static_cast<uint32_t*>(entries_buffer_.data()); }

  /// The device's free-unit stack (room for every unit) and its count, a u32 in device memory: the
  /// units finalize_blocks() gives back are pushed there. Starts as the host cache's free units that
  /// the device pool holds, in the host's order.
  uint32_t* free_stack_data() const { return static_cast<uint32_t*>(free_stack_buffer_.data()); }
  uint32_t* free_count_data() const { return static_cast<uint32_t*>(free_count_buffer_.data()); }
  /// The free units on the device, bottom of the stack first (synchronises: for tests and tools).
  std::vector<uint32_t> free_units() const;
  /// Number of free units on the device (synchronises the device: kernels on any stream).
  uint32_t free_unit_count() const;
  /// Sticky status word in device memory: kOutOfUnits once a begin_tokens found too few free units
  /// (the tiles it could not open stay absent). 0 while all is well.
  uint32_t* status_data() const { return static_cast<uint32_t*>(status_buffer_.data()); }
  /// The status word (synchronises the device).
  uint32_t status() const;
  /// Status bit: a block could not be opened for want of free units.
  static constexpr uint32_t kOutOfUnits = 1;
  /// Takes `count` block rows no sequence uses yet (for DeviceSequences::reserve); throws when the
  /// table has too few left.
  uint32_t take_rows(uint32_t count);
  /// Entries of the block table by class (raw includes the open blocks' tails).
  struct TileCounts {
    uint64_t compressed = 0, raw = 0, absent = 0;
  };
  /// Counts the entries of each class in the block table (synchronises; for accounting).
  TileCounts count_tiles() const;

 private:
  PagedCacheView view_;
  std::vector<int32_t> windows_;
  uint32_t units_ = 0;
  DeviceBuffer units_buffer_, entries_buffer_, bases_buffer_, lane_bases_buffer_, windows_buffer_;
  /// The free stack (holding `free_units`, bottom first), its count, the status word and the view.
  void finish(const PagedGeometry& geo, const std::vector<uint32_t>& free_units);

  DeviceBuffer free_stack_buffer_, free_count_buffer_, status_buffer_;
  uint32_t rows_taken_ = 0;
};

/// The sequence tables of a batch in device memory, with the host-side numbers a launch needs.
class DeviceSequences {
 public:
  /// Copies a host table (its pointers are host memory) to the device.
  static DeviceSequences upload(const SequenceTableView& host);
  /// `sequences` empty sequences of a cache made by DeviceCache::create, each with block rows
  /// reserved for `max_tokens` tokens: they grow on the device (begin_tokens), without the host.
  static DeviceSequences reserve(DeviceCache& cache, int sequences, int max_tokens);

  const SequenceTableView& view() const { return view_; }
  int sequences() const { return view_.sequences; }
  /// Length of sequence s in tokens.
  int length(int s) const { return lengths_.at(static_cast<size_t>(s)); }
  /// Blocks of sequence s.
  int blocks(int s) const { return blocks_.at(static_cast<size_t>(s)); }
  /// Blocks of sequence s attended by its newest token under a sliding window (0: none).
  int attended_blocks(int s, int window) const;
  /// Total block rows listed (indptr[sequences]).
  int total_blocks() const { return total_blocks_; }
  /// Tokens each sequence has room for (reserved tables; for uploaded ones, 16 × its blocks).
  int capacity(int s) const { return blocks(s) * kTileTokens; }
  /// The device lengths, writable (kernels that grow the sequences).
  int32_t* lengths_data() const { return static_cast<int32_t*>(lengths_buffer_.data()); }
  /// Tokens added by the last begin_tokens (0 before any).
  int last_count() const { return last_count_; }
  /// Scratch rows (one per sequence and block) for finalize_completed.
  uint32_t* scratch_rows() const { return static_cast<uint32_t*>(scratch_rows_.data()); }
  /// The host's side of begin_tokens: every length grows by `count` (throws past a capacity).
  void note_begin(int count);

 private:
  SequenceTableView view_;
  std::vector<int32_t> lengths_, blocks_;
  int total_blocks_ = 0;
  int last_count_ = 0;
  DeviceBuffer indptr_, rows_, lengths_buffer_, scratch_rows_;
};

/// Which parts of decode attention a launch does; anything but `full` is for time breakdowns and
/// leaves the output meaningless.
enum class Work : uint8_t {
  full = 0,       ///< attention
  no_math = 1,    ///< load tiles and rebuild operand registers, no products or softmax
  no_decode = 2,  ///< load tiles and multiply their stored words as they are (compressed caches only)
  load_only = 3,  ///< bring tiles to shared memory only
};

/// One decode-attention call: a layer of the cache, one query token per sequence.
struct DecodeConfig {
  int layer = 0;
  int q_heads = 0;             ///< query heads: a multiple of the KV heads, at most 8 per KV head
  float softmax_scale = 0.0f;  ///< 0: 1/sqrt(head_dim)
  int blocks_per_split = 0;    ///< blocks per CTA; 0: chosen from the context and the SM count
  /// Plan as if the longest sequence had at least this many tokens (0: the lengths): a launch captured
  /// in a CUDA graph stays right while its sequences grow up to this length on the device.
  int plan_tokens = 0;
  int stages = 0;              ///< pipeline stages per warp; 0: the kernel's default (2, 3 or 4 exist)
  Work work = Work::full;
};

/// How a launch splits the context over CTAs.
struct DecodePlan {
  int blocks_per_split = 0;  ///< 16-token blocks per CTA
  int max_splits = 0;        ///< CTAs per (sequence, KV head) for the longest sequence
  int merge_group = 0;       ///< splits merged together first (then the groups): about sqrt(max_splits)
  int max_groups = 0;        ///< merge groups of the longest sequence
  int ctas_per_sm = 0;       ///< resident CTAs per SM the split was sized for
  size_t shared_bytes = 0;   ///< dynamic shared memory per CTA
};

/// Chooses the split for a launch: one wave of CTAs over the whole GPU, at least two blocks per warp,
/// every CTA of a sequence with the same number of blocks (a config's blocks_per_split, when set,
/// wins). Depends on the kernel only through its occupancy: launches given the same blocks_per_split
/// do the same arithmetic in the same order.
DecodePlan plan_decode(const DeviceCache& cache, const DeviceSequences& sequences, const DecodeConfig& config);

/// Device scratch memory of decode_attention: partial results of the splits and of their merge
/// groups, and arrival counters (zero between launches).
class DecodeWorkspace {
 public:
  DecodeWorkspace() = default;
  /// Room for `sequences` × `kv_heads` × `max_splits` partial results (and `max_groups` merged
  /// groups) of `group` heads × `head_dim`.
  DecodeWorkspace(int sequences, int kv_heads, int group, int head_dim, int max_splits, int max_groups);
  /// True when it has room for that many.
  bool fits(int sequences, int kv_heads, int group, int head_dim, int max_splits, int max_groups) const;

  float* partial_o() const { return static_cast<float*>(partial_o_.data()); }
  float* partial_ml() const { return static_cast<float*>(partial_ml_.data()); }
  float* group_o() const { return static_cast<float*>(group_o_.data()); }
  float* group_ml() const { return static_cast<float*>(group_ml_.data()); }
  uint32_t* counters() const { return static_cast<uint32_t*>(counters_.data()); }
  /// Partial results per (sequence, KV head) it has room for: the stride the kernels index with.
  int split_capacity() const { return max_splits_; }
  /// Merged groups per (sequence, KV head) it has room for.
  int group_capacity() const { return max_groups_; }

 private:
  int sequences_ = 0, kv_heads_ = 0, group_ = 0, head_dim_ = 0, max_splits_ = 0, max_groups_ = 0;
  DeviceBuffer partial_o_, partial_ml_, group_o_, group_ml_, counters_;
};

/// Decode attention of one query token per sequence over layer `config.layer` of `cache`: the fused
/// GAAC kernel for a compressed cache, the BF16 twin for a BF16 cache. `q` and `out` are device
/// arrays `[sequences][q_heads][head_dim]` of BF16 bit patterns; query head h reads KV head
/// h / (q_heads / kv_heads). The workspace grows when too small. Asynchronous on `stream`.
DecodePlan decode_attention(const DeviceCache& cache, const DeviceSequences& sequences, const DecodeConfig& config,
                            const uint16_t* q, uint16_t* out, DecodeWorkspace& workspace, Stream stream = nullptr);

/// Decompress-first: writes every tile that the sequences' blocks hold in `layer` of `compressed`
/// into `bf16` (made by DeviceCache::bf16_for) as a raw BF16 tile, entries included.
void decompress(const DeviceCache& compressed, const DeviceSequences& sequences, int layer, DeviceCache& bf16,
                Stream stream = nullptr);

/// Where decompress_dense() writes: element (layer l, token t, KV head h, channel c) of K goes to
///   k + l·layer_stride + X + h·head_stride + c,
/// with X = s·outer_stride + position·token_stride for the token at `position` of sequence s
/// (`paged` false: `[sequences][tokens][heads][dim]`, e.g. `[tokens, heads, dim]` for one sequence), or
/// X = row·outer_stride + (position mod 16)·token_stride for a token of block row `row` (`paged` true:
/// FlashInfer's paged NHD, one 16-token page per block row). V alike. Strides count elements.
struct DenseLayout {
  uint16_t* k = nullptr;
  uint16_t* v = nullptr;
  bool paged = false;
  int64_t layer_stride = 0;
  int64_t outer_stride = 0;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
};

/// Decompresses layers `first_layer .. first_layer + layers - 1` of every sequence of `sequences`:
/// every token the cache holds (compressed slots, raw tiles, the BF16 tails; tiles released by a
/// sliding window are skipped, their destination left as it was) as BF16 into `out`. Works on a
/// compressed or a BF16 cache. Asynchronous on `stream`.
void decompress_dense(const DeviceCache& cache, const DeviceSequences& sequences, int first_layer, int layers,
                      const DenseLayout& out, Stream stream = nullptr);

/// Finalizes open blocks on the device, as KvCache::append does on the host when a block's 16th
/// token arrives: in layers `first_layer .. first_layer + layers - 1` of the `count` block rows
/// `rows` (device memory; kNoRow entries are skipped), every raw tile is encoded once with the cache's
/// escape capacity. A tile whose escapes fit becomes a compressed tile in its first unit (its entry
/// changes class, not unit) and its second unit is pushed on the device free stack; a tile that does
/// not fit stays raw. Compressed and absent tiles are left alone, so finalizing a block twice changes
/// nothing. The caller has written all 16 tokens of every tile it names. Slot and entry bytes equal
/// the host cache's; the free stack holds the same units, in the order the CTAs finish. Many blocks
/// in one call never race: each tile is one warp's, and each CTA reserves its stack slots with one
/// atomic. Asynchronous on `stream`; a compressed cache only.
void finalize_blocks(DeviceCache& cache, const uint32_t* rows, int count, int first_layer, int layers,
                     Stream stream = nullptr);

/// Where write_tokens() reads: token j of sequence s, KV head h, channel c of K is
/// `k[s·sequence_stride + h·head_stride + j·token_stride + c]` (V alike, the same strides); strides
/// count elements and are multiples of 8, the pointers 16-byte aligned (PyTorch's `[batch, kv_heads,
/// tokens, head_dim]` key states, transposed or not).
struct TokenRows {
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  int64_t sequence_stride = 0;
  int64_t head_stride = 0;
  int64_t token_stride = 0;
};

/// Adds `count` tokens to every sequence of `sequences` (a reserved table), on the device: in each
/// layer, the tiles of a sliding window's blocks that the new newest token no longer sees are freed
/// (entries absent, units pushed on the free stack), every block the new tokens start is opened as a
/// BF16 tail (its tiles' units popped from the free stack and zeroed; in a sliding layer only blocks
/// the window still sees), and the lengths grow by `count`. With too few free units the tiles that
/// could not be opened stay absent and the cache's status word gets kOutOfUnits: check status()
/// before trusting what follows. Graph-safe: no host sync, no allocation; asynchronous on `stream`.
/// The host keeps the lengths too (for plans); throws when a sequence would pass its capacity.
void begin_tokens(DeviceCache& cache, DeviceSequences& sequences, int count, Stream stream = nullptr);

/// Writes the K and V rows of the tokens the last begin_tokens added (its `count` tokens of every
/// sequence) into layer `layer`'s tails. Graph-safe; asynchronous on `stream`.
void write_tokens(DeviceCache& cache, const DeviceSequences& sequences, int layer, const TokenRows& rows,
                  Stream stream = nullptr);

/// Finalizes (finalize_blocks) every block of every layer that the last begin_tokens completed, the
/// rows chosen on the device from the lengths. Call it after write_tokens of every layer, before the
/// next begin_tokens. Nothing to do for a BF16 cache. Graph-safe; asynchronous on `stream`.
void finalize_completed(DeviceCache& cache, DeviceSequences& sequences, Stream stream = nullptr);

/// One tensor section of a .gaac snapshot (docs/format.md, section 11) for (layer, kind) of
/// `calibration`, encoded on the device from a dense BF16 tensor there: `tokens` rows of `kv_heads` ×
/// head_dim elements, `token_stride` elements apart (heads consecutive inside a row). Byte for byte
/// what the host snapshot writer makes of the same values. Synchronises `stream`.
std::vector<uint8_t> encode_snapshot_section(const uint16_t* tensor, int tokens, size_t token_stride,
                                             const CalibrationTable& calibration, TensorKind kind, int layer,
                                             Stream stream = nullptr);

/// The .gaac image of `dump` (as gaac::snapshot_image makes it, byte for byte) with its tiles encoded
/// on the device: every tensor is copied there and encoded with encode_snapshot_section().
std::vector<uint8_t> snapshot_image(const KvDump& dump, const CalibrationTable& calibration,
                                    const Progress& progress = {});

}  // namespace gaac::cuda
