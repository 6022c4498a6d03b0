// gaac on NVIDIA GPUs (sm_90), the library gaac::cuda: a paged cache's memory on the device
// (docs/format.md, section 13) and the sequence tables of a batch; decode attention over it (the fused
// GAAC kernel, its BF16 twin), planned once per batch geometry and launched per layer; caches grown on
// the device (open, write, finalize: every step graph-safe); decompression to dense or paged BF16; and
// .gaac snapshot encoding from device tensors. On top, two caches a framework holds: KvCacheMirror (a
// host KvCache copied to the GPU) and the device implementation of gaac::BatchKvCache.
//
// Host API only: nothing here needs a CUDA compiler. Every function throws gaac::Error on a CUDA
// failure or bad input; pointers named "device" are device memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gaac/batch_kv_cache.hpp"
#include "gaac/calibration.hpp"
#include "gaac/chunk.hpp"
#include "gaac/cuda_views.hpp"
#include "gaac/export.h"
#include "gaac/kv_cache.hpp"
#include "gaac/kv_dump.hpp"
#include "gaac/paged_layout.hpp"

struct CUstream_st;

namespace gaac::cuda {

/// A CUDA stream (cudaStream_t); null is the default stream.
using Stream = CUstream_st*;

/// True when the CUDA runtime finds at least one device (false, never an error, without a driver).
GAAC_API bool device_available();
/// "name, N SMs, compute capability X.Y" of the current device.
GAAC_API std::string device_description();

/// An owning, move-only device allocation from cudaMalloc.
class GAAC_API DeviceBuffer {
 public:
  DeviceBuffer() = default;
  /// Allocates `bytes` bytes (none for 0).
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  /// The device pointer (null when empty).
  void* data() const { return data_; }
  /// Bytes allocated.
  size_t bytes() const { return bytes_; }
  /// Copies `bytes` bytes from host memory at `src` to offset `offset` (synchronous).
  void upload(const void* src, size_t bytes, size_t offset = 0);
  /// Copies `bytes` bytes from offset `offset` to host memory at `dst` (synchronous).
  void download(void* dst, size_t bytes, size_t offset = 0) const;

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

/// A paged cache's memory on the device: its unit pool, block table, bases, windows, free-unit stack
/// and status word, in the layout of the host cache it copies or was carved like.
class GAAC_API CacheMemory {
 public:
  /// Copies a host cache to the device, in its layout: the pool up to its last unit in use (units past
  /// it hold nothing a kernel reads), the whole block table, the bases and the windows; the free stack
  /// holds the host's free units the device pool has, in the host's order.
  static CacheMemory upload(const KvCache& host);
  /// An empty cache made on the device alone, carved from `config`'s budget exactly as a KvCache of
  /// that config is (the same unit size, units, block rows and bases), every unit free. Sequences grow
  /// in it on the device: BatchTable::reserve, then begin_tokens, write_tokens and finalize_completed.
  static CacheMemory create(const CacheConfig& config);
  /// An empty BF16 cache of one layer with `like`'s KV heads, head width and rows, one unit for every
  /// entry: what decompress() writes.
  static CacheMemory bf16_for(const PagedGeometry& like, int window);

  /// The device pointers kernels take.
  const DeviceCacheView& view() const { return view_; }
  /// The layout numbers.
  const PagedGeometry& geometry() const { return view_.geometry; }
  /// Sliding window of a layer in tokens (0: full attention), from the host's copy.
  int window(int layer) const { return windows_.at(static_cast<size_t>(layer)); }
  /// Every layer's sliding window (host copy).
  const std::vector<int32_t>& windows() const { return windows_; }
  /// Units in the pool.
  uint32_t units() const { return units_; }
  /// True for a cache of compressed slots (units smaller than a raw tile); false for a BF16 cache.
  bool compressed() const { return view_.geometry.raw_split(); }
  /// Copies the pool and the block table back to host memory (synchronous; for tests and tools).
  void download(std::vector<uint8_t>& units, std::vector<uint32_t>& entries) const;
  /// The free units on the device, bottom of the stack first (synchronises the device).
  std::vector<uint32_t> free_units() const;
  /// Number of free units on the device (synchronises the device: kernels on any stream).
  uint32_t free_unit_count() const;
  /// The status word (synchronises the device): kOutOfUnits once a begin_tokens found too few free
  /// units (the tiles it could not open stay absent). 0 while all is well.
  uint32_t status() const;
  /// Status bit: a block could not be opened for want of free units.
  static constexpr uint32_t kOutOfUnits = 1;
  /// Takes `count` block rows no sequence uses yet (for BatchTable::reserve); throws when the table has
  /// too few left.
  uint32_t take_rows(uint32_t count);
  /// Entries of the block table by class (raw includes the open blocks' tails).
  struct TileCounts {
    uint64_t compressed = 0, raw = 0, absent = 0;
  };
  /// Counts the entries of each class in the block table (synchronises; for accounting).
  TileCounts count_tiles() const;

 private:
  /// Sets up the free stack (holding `free_units`, bottom first), the status word and the view.
  void finish(const PagedGeometry& geo, const std::vector<uint32_t>& free_units);

  DeviceCacheView view_;
  std::vector<int32_t> windows_;
  uint32_t units_ = 0;
  uint32_t rows_taken_ = 0;
  DeviceBuffer units_buffer_, entries_buffer_, bases_buffer_, lane_bases_buffer_, windows_buffer_;
  DeviceBuffer free_stack_buffer_, free_count_buffer_, status_buffer_;
};

/// The sequence table of a batch on the device, with the host's copy of its numbers (what a plan
/// needs without reading the device).
class GAAC_API BatchTable {
 public:
  /// Copies a host table (its pointers are host memory) to the device.
  static BatchTable upload(const SequenceTableView& host);
  /// `sequences` empty sequences of a cache made by CacheMemory::create, each with block rows reserved
  /// for `max_tokens` tokens: they grow on the device (begin_tokens), without the host.
  static BatchTable reserve(CacheMemory& cache, int sequences, int max_tokens);

  /// The device pointers kernels take.
  const DeviceBatchView& view() const { return view_; }
  /// Sequences in the batch.
  int sequences() const { return view_.sequences; }
  /// Length of sequence s in tokens, as the host counts it.
  int length(int s) const { return lengths_.at(static_cast<size_t>(s)); }
  /// Blocks listed for sequence s.
  int blocks(int s) const { return blocks_.at(static_cast<size_t>(s)); }
  /// Blocks of sequence s attended by its newest token under a sliding window (0: none).
  int attended_blocks(int s, int window) const;
  /// Total block rows listed (indptr[sequences]).
  int total_blocks() const { return total_blocks_; }
  /// Tokens sequence s has room for (16 × its blocks).
  int capacity(int s) const { return blocks(s) * kTileTokens; }
  /// Tokens added by the last begin_tokens (0 before any).
  int last_count() const { return last_count_; }
  /// Scratch rows (one per sequence and block) for finalize_completed; null for an uploaded table.
  uint32_t* scratch_rows() const { return static_cast<uint32_t*>(scratch_rows_.data()); }
  /// The host's side of begin_tokens: every length grows by `count` (throws past a capacity, changing
  /// nothing).
  void note_begin(int count);

 private:
  DeviceBatchView view_;
  std::vector<int32_t> lengths_, blocks_;
  int total_blocks_ = 0;
  int last_count_ = 0;
  DeviceBuffer indptr_, rows_, lengths_buffer_, scratch_rows_;
};

/// What a decode-attention plan is made for: one query token per sequence.
struct DecodeConfig {
  int q_heads = 0;             ///< query heads: a multiple of the KV heads, at most 16 per KV head
  int blocks_per_split = 0;    ///< 16-token blocks per CTA; 0: chosen from the context and the SM count
  /// Plan as if the longest sequence had at least this many tokens (0: the lengths): launches captured
  /// in a CUDA graph stay right while their sequences grow up to this length on the device.
  int plan_tokens = 0;
  int stages = 0;              ///< pipeline stages per warp; 0: the kernel's default
  int warps = 0;               ///< warps per CTA; 0: the kernel's default (16 for heads of 64 or 128 channels
                               ///< with up to 8 query heads per KV head, else 4; 4 and 8 exist too)
  Work work = Work::full;
};

/// How the launches over the layers of one sliding window split the context over CTAs.
struct DecodeSplit {
  int window = 0;            ///< the layers' sliding window (0: full attention)
  int planned_blocks = 0;    ///< attended blocks of the longest sequence the split was made for
  int blocks_per_split = 0;  ///< 16-token blocks per CTA
  int max_splits = 0;        ///< CTAs per (sequence, KV head) for the longest sequence
  int merge_group = 0;       ///< splits merged together first (then the groups): about sqrt(max_splits)
  int max_groups = 0;        ///< merge groups of the longest sequence
  int ctas_per_sm = 0;       ///< resident CTAs per SM the split was sized for
  size_t shared_bytes = 0;   ///< dynamic shared memory per CTA
  int warps = 0;             ///< warps per CTA of the kernel instance launched
  int stages = 0;            ///< pipeline stages per warp of that instance
};

/// Decode attention planned once per batch geometry and run per layer (as FlashInfer's plan/run):
/// plan() chooses the kernel instance and, for each sliding window among the cache's layers, the
/// split of the context over CTAs (one wave over the GPU, at least one block per warp, every CTA of a
/// sequence with the same number of blocks), and holds the workspace the launches need (partial
/// results and arrival counters), allocating it only when the one it has is too small. run() only
/// launches: no allocation, no host synchronisation, so it can be captured in a CUDA graph. Launches
/// with the same blocks_per_split do the same arithmetic in the same order: a GAAC cache and a BF16
/// cache holding the same values give the same bits.
class GAAC_API DecodePlan {
 public:
  DecodePlan();
  ~DecodePlan();
  DecodePlan(DecodePlan&&) noexcept;
  DecodePlan& operator=(DecodePlan&&) noexcept;
  DecodePlan(const DecodePlan&) = delete;
  DecodePlan& operator=(const DecodePlan&) = delete;

  /// Plans for `batch` over `cache` (host work, and an allocation when the workspace must grow).
  void plan(const CacheMemory& cache, const BatchTable& batch, const DecodeConfig& config);
  /// True once plan() has run.
  bool planned() const;
  /// What the plan was made for.
  const DecodeConfig& config() const;
  /// The split of the launches over `layer`.
  const DecodeSplit& split(int layer) const;
  /// True when a launch over `batch` and `cache` needs no new plan: the same geometry and format, no
  /// more sequences, none attending more blocks than planned.
  bool covers(const CacheMemory& cache, const BatchTable& batch) const;
  /// Bytes of device workspace held.
  size_t workspace_bytes() const;

  /// Decode attention of one query token per sequence (its newest) over layer `layer`: the fused GAAC
  /// kernel for a compressed cache, the BF16 twin for a BF16 one. `q` and `out` are device arrays
  /// `[sequences][q_heads][head_dim]` of BF16; query head h reads KV head h / (q_heads / kv_heads);
  /// `scale` multiplies the scores (0: 1/sqrt(head_dim)). Asynchronous on `stream`. Throws, launching
  /// nothing, when the plan does not cover the cache and batch (plan again).
  void run(const CacheMemory& cache, const BatchTable& batch, int layer, const uint16_t* q, uint16_t* out,
           float scale = 0.0f, Stream stream = nullptr) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// Decompress-first: writes every tile that the sequences' blocks hold in `layer` of `compressed`
/// into `bf16` (made by CacheMemory::bf16_for) as a raw BF16 tile, entries included.
GAAC_API void decompress(const CacheMemory& compressed, const BatchTable& batch, int layer, CacheMemory& bf16,
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

/// Decompresses layers `first_layer .. first_layer + layers - 1` of every sequence of `batch`: every
/// token the cache holds (compressed slots, raw tiles, the BF16 tails; tiles released by a sliding
/// window are skipped, their destination left as it was) as BF16 into `out`. Works on a compressed or
/// a BF16 cache. Asynchronous on `stream`.
GAAC_API void decompress_dense(const CacheMemory& cache, const BatchTable& batch, int first_layer, int layers,
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
GAAC_API void finalize_blocks(CacheMemory& cache, const uint32_t* rows, int count, int first_layer, int layers,
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

/// Adds `count` tokens to every sequence of `batch` (a reserved table), on the device: in each layer,
/// the tiles of a sliding window's blocks that the new newest token no longer sees are freed (entries
/// absent, units pushed on the free stack), every block the new tokens start is opened as a BF16 tail
/// (its tiles' units popped from the free stack and zeroed; in a sliding layer only blocks the window
/// still sees), and the lengths grow by `count`. With too few free units the tiles that could not be
/// opened stay absent and the status word gets kOutOfUnits: check status() before trusting what
/// follows. Graph-safe: no host sync, no allocation; asynchronous on `stream`. The host keeps the
/// lengths too (for plans); throws, launching nothing, when a sequence would pass its capacity.
GAAC_API void begin_tokens(CacheMemory& cache, BatchTable& batch, int count, Stream stream = nullptr);

/// Writes the K and V rows of the tokens the last begin_tokens added (its `count` tokens of every
/// sequence) into layer `layer`'s tails. Graph-safe; asynchronous on `stream`.
GAAC_API void write_tokens(CacheMemory& cache, const BatchTable& batch, int layer, const TokenRows& rows,
                           Stream stream = nullptr);

/// Finalizes (finalize_blocks) every block of every layer that the last begin_tokens completed, the
/// rows chosen on the device from the lengths. Call it after write_tokens of every layer, before the
/// next begin_tokens. Nothing to do for a BF16 cache. Graph-safe; asynchronous on `stream`.
GAAC_API void finalize_completed(CacheMemory& cache, BatchTable& batch, Stream stream = nullptr);

/// One tensor section of a .gaac snapshot (docs/format.md, section 11) for (layer, kind) of
/// `calibration`, encoded on the device from a dense BF16 tensor there: `tokens` rows of `kv_heads` ×
/// head_dim elements, `token_stride` elements apart (heads consecutive inside a row). Byte for byte
/// what the host snapshot writer makes of the same values. Synchronises `stream`.
GAAC_API std::vector<uint8_t> encode_snapshot_section(const uint16_t* tensor, int tokens, size_t token_stride,
                                                      const CalibrationTable& calibration, TensorKind kind, int layer,
                                                      Stream stream = nullptr);

/// The .gaac image of `dump` (as gaac::snapshot_image makes it, byte for byte) with its tiles encoded
/// on the device: every tensor is copied there and encoded with encode_snapshot_section().
GAAC_API std::vector<uint8_t> snapshot_image(const KvDump& dump, const CalibrationTable& calibration,
                                             const Progress& progress = {});

/// KV chunk objects (docs/format.md, section 14) coded on the GPU: the same bytes as gaac::ChunkCodec
/// makes of the same values, from and to chunks and objects in device memory, with no copy through
/// the host (the host reads back only a few bytes: an object's size, a status). Every tile is one
/// warp's; the escape stream is placed by a scan; the checksums are computed on the device, one
/// thread per 4 KiB piece. Thread-safe: calls from many threads (on their own streams) run at once.
class GAAC_API ChunkCodec {
 public:
  /// A codec for `calibration`'s chunks on the current device (its bases copied there);
  /// `options.threads` is not used. Throws gaac::Error as gaac::ChunkCodec does.
  explicit ChunkCodec(const CalibrationTable& calibration, ChunkOptions options = {});
  ~ChunkCodec();
  ChunkCodec(const ChunkCodec&) = delete;
  ChunkCodec& operator=(const ChunkCodec&) = delete;

  /// As gaac::ChunkCodec::object_bytes.
  size_t object_bytes(int tokens) const;
  /// Writes the object of `chunk` (device memory; rows 16-byte aligned, strides multiples of 8
  /// elements) stored under `key` to `out` (device memory, `out_bytes` ≥ object_bytes()) and returns
  /// its size, as gaac::ChunkCodec::encode. Synchronises `stream`.
  size_t encode(const ChunkView& chunk, std::string_view key, uint8_t* out, size_t out_bytes, Stream stream = nullptr) const;
  /// Reads the object at the start of `object` (device memory, `object_bytes` long at most) into
  /// `chunk` (device memory, as for encode), after checking everything gaac::ChunkCodec::decode
  /// checks; throws gaac::Error saying what is wrong. Synchronises `stream`.
  void decode(const uint8_t* object, size_t object_bytes, std::string_view key, const MutableChunkView& chunk,
              Stream stream = nullptr) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// A host KvCache copied to the GPU with the table of some of its sequences, for decode attention and
/// decompression there. A copy: later changes of the host cache are not seen.
class GAAC_API KvCacheMirror {
 public:
  /// Copies `host` and the table of `sequences` (in that order) to the device.
  KvCacheMirror(const KvCache& host, std::span<const SequenceId> sequences);

  /// Decode attention of each sequence's newest token over `layer`: `q` and `out` device arrays
  /// `[sequences][q_heads][head_dim]` of BF16; `scale` 0 for 1/sqrt(head_dim); `blocks_per_split` 0
  /// for the planned split. Plans when q_heads or the split change; asynchronous on `stream`.
  void attend(int layer, const uint16_t* q, uint16_t* out, int q_heads, float scale = 0.0f, int blocks_per_split = 0,
              Stream stream = nullptr);
  /// The blocks per split attend() plans for `layer` with `q_heads` query heads.
  int planned_blocks_per_split(int layer, int q_heads);
  /// Every value the mirror holds for its sequences, as BF16, into `k` and `v`: contiguous device arrays
  /// `[layers][sequences][longest length][kv_heads][head_dim]` (positions past a sequence's length, and
  /// tiles released by a sliding window, left as they were). Asynchronous on `stream`.
  void decompress(uint16_t* k, uint16_t* v, Stream stream = nullptr) const;
  /// Sequences mirrored.
  int sequences() const { return batch_.sequences(); }
  /// Tokens of the longest sequence.
  int longest() const;
  /// The device memory and the batch table.
  const CacheMemory& memory() const { return memory_; }
  const BatchTable& batch() const { return batch_; }

 private:
  void plan_for(int q_heads, int blocks_per_split);

  CacheMemory memory_;
  BatchTable batch_;
  DecodePlan plan_;
};

/// A batch cache in device memory (gaac::BatchKvCache): carved from `config.cache`'s budget on the
/// current device, its sequences grown there in lockstep (begin_tokens, write_tokens, and after the
/// last layer's rows finalize_completed), attended by the fused kernel (the twin for a BF16 cache)
/// with a plan made at the first attend() of each forward. Rows and queries are device arrays; a
/// forward of more than one token on a cache that held tokens before it cannot be attended yet.
GAAC_API std::unique_ptr<BatchKvCache> make_device_batch_kv_cache(const BatchCacheConfig& config);

}  // namespace gaac::cuda
