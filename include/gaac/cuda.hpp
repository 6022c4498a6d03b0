// gaac on NVIDIA GPUs (sm_90), the library gaac::cuda: a paged cache's memory on the device
// (docs/format.md, section 13) and the sequence tables of a batch; decode attention over it (the fused
// GAAC kernel, its BF16 twin), planned once per batch geometry and launched per layer; caches grown on
// the device (open, write, finalize: every step graph-safe; pads skipped, each sequence by its own
// tokens) and edited there (forks, truncation, copies); decompression to dense or paged BF16; and
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
  /// A copy of every byte in an allocation of its own (synchronous with the host, after the device's
  /// queued work).
  DeviceBuffer copy() const;

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
  /// holds the host's free units the device pool has, in the host's order. Any format: BF16 (gaac,
  /// bf16) or FP8 (gaac_fp8, fp8, with their scales); an FP8 cache on the device is read by decode
  /// attention only (every kernel that writes or rebuilds tiles refuses it), and marks the tiles that
  /// hold a NaN or infinity code, which attention widens through the table of exact values.
  static CacheMemory upload(const KvCache& host);
  /// An empty cache made on the device alone, carved from `config`'s budget exactly as a KvCache of
  /// that config is (the same unit size, units, block rows and bases), every unit free. Sequences grow
  /// in it on the device: BatchTable::reserve, then begin_tokens, write_tokens and finalize_completed.
  static CacheMemory create(const CacheConfig& config);
  /// An empty BF16 cache of one layer with `like`'s KV heads, head width and rows, one unit for every
  /// entry: what decompress() writes.
  static CacheMemory bf16_for(const PagedGeometry& like, int window);
  /// A deep copy on the same device: pool, table, free stack, reference counts and status, in memory of
  /// its own (synchronises the device first).
  CacheMemory clone() const;

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
  /// True for a cache of compressed slots (units smaller than a raw tile: gaac, gaac_fp8); false for a
  /// BF16 or plain FP8 cache.
  bool compressed() const { return view_.geometry.raw_split(); }
  /// The elements its tiles hold: BF16, or the FP8 format of an FP8 cache.
  ElementFormat element_format() const { return view_.geometry.element_format; }
  /// The scale of layer `layer`'s K or V codes in an FP8 cache (1 in a BF16 cache): code x stands for
  /// fp8_to_float(x) · scale.
  float scale(int layer, TensorKind kind) const;
  /// Throws gaac::Error naming `what` unless the cache holds BF16 tiles: every kernel but decode
  /// attention (growth, finalize, edits, decompression) reads and writes BF16 only.
  void require_bf16(const char* what) const;
  /// Copies the pool and the block table back to host memory (synchronous; for tests and tools).
  void download(std::vector<uint8_t>& units, std::vector<uint32_t>& entries) const;
  /// The block table, copied to host memory (synchronises the device).
  std::vector<uint32_t> entries() const;
  /// The reference count of every unit (synchronises the device; for tests): entries holding it as a
  /// tile's first unit.
  std::vector<uint32_t> refs() const;
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
  DeviceBuffer free_stack_buffer_, free_count_buffer_, status_buffer_, refs_buffer_;
  std::vector<float> k_scales_, v_scales_;       ///< FP8 caches: per layer (empty: all 1)
  DeviceBuffer special_buffer_, widening_buffer_;  ///< FP8 caches: DeviceCacheView::special, ::widening
};

/// The sequence table of a batch on the device, with the host's copy of its numbers (what a plan
/// needs without reading the device).
class GAAC_API BatchTable {
 public:
  /// Copies a host table (its pointers are host memory) to the device.
  static BatchTable upload(const SequenceTableView& host);
  /// `sequences` empty sequences of a cache made by CacheMemory::create, each with block rows reserved
  /// for `max_tokens` tokens: they grow on the device (begin_tokens), without the host, and can be
  /// edited between forwards (select, truncate).
  static BatchTable reserve(CacheMemory& cache, int sequences, int max_tokens);
  /// A deep copy in device memory of its own, for a copy of its cache (CacheMemory::clone): synchronous.
  BatchTable clone() const;

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
  /// Tokens per sequence of the last begin_tokens, pads included (0 before any, and after an edit).
  int last_count() const { return last_count_; }
  /// Real tokens sequence s added in the last begin_tokens (0 after an edit).
  int last_real(int s) const { return counts_.empty() ? 0 : counts_.at(static_cast<size_t>(s)); }
  /// True when the last begin_tokens had no pad token.
  bool last_uniform() const { return ranks_.empty(); }
  /// True when the last begin_tokens was unattended (see DeviceForwardView::unattended).
  bool last_unattended() const { return unattended_; }
  /// The length whose newest token's sliding windows sequence s keeps (DeviceForwardView::held): in a
  /// layer of window W its blocks before first_attended(held − 1, W) / 16 are released.
  int held(int s) const { return held_.empty() ? 0 : held_.at(static_cast<size_t>(s)); }
  /// The block row of block `block` of sequence s in a reserved table (its rows are fixed while it is
  /// not edited).
  uint32_t block_row(int s, int block) const;
  /// Scratch rows (one per sequence and block) for finalize_completed; null for an uploaded table.
  uint32_t* scratch_rows() const { return static_cast<uint32_t*>(scratch_rows_.data()); }
  /// The last begin_tokens as the growth kernels read it.
  DeviceForwardView forward_view() const;
  /// The host's side of a begin_tokens of `count` real tokens per sequence, attended as the last one
  /// (what a replayed graph of the last begin did on the device): lengths and held lengths grow (throws
  /// past a capacity, changing nothing).
  void note_begin(int count);
  /// The host's side of a begin_tokens of `tokens` tokens per sequence of which `valid` (empty: all;
  /// else sequences × tokens flags, 0 for a pad) are real, `attended` or not (DeviceForwardView):
  /// checks, then counts them and grows the lengths (throws past a capacity, changing nothing). Device
  /// buffers are left to begin_tokens.
  void note_begin(int tokens, std::span<const uint8_t> valid, bool attended);
  /// Copies the last note_begin's counts and ranks (a forward with pads) to the device, asynchronously
  /// on `stream` (allocating when the forward is larger than any before); begin_tokens does it.
  void upload_forward(Stream stream);

  /// Between forwards (everything queued on the device is waited for; synchronous): the batch becomes
  /// `sources.size()` sequences, sequence i holding what sequence sources[i] held. A sequence's first use
  /// keeps its rows; each further use is a fork: its complete blocks' entries are copied, their tiles
  /// shared (CacheMemory's per-unit reference counts grow), and its open block's tiles are copied into
  /// units of their own. Sequences no one names are freed (each tile's reference dropped, its units
  /// pushed on the free stack when no entry holds it any longer). A reserved table only. Throws
  /// gaac::Error (ErrorCode::out_of_space), changing nothing, when the forks' open blocks or block rows do
  /// not fit; gaac::Error when the cache ran out of units earlier (its contents are incomplete).
  void select(CacheMemory& cache, std::span<const int> sources);
  /// Between forwards (synchronous): cuts every sequence b back to its first `lengths[b]` tokens, as
  /// KvCache::truncate does: later blocks are released, and a block cut inside becomes a BF16 tail
  /// again, bit for bit (a compressed tile decoded back into a raw tile, a tile a fork shares copied
  /// first; an unshared raw tile keeps its unit, its later rows zeroed). A reserved table only. Throws
  /// gaac::Error for a length past a sequence's or one whose newest token would attend what a sliding
  /// window released; ErrorCode::out_of_space, changing nothing, when the cut blocks need more free units
  /// than there are.
  void truncate(CacheMemory& cache, std::span<const int> lengths);

  /// Makes this table the queries of `batch`'s running forward as sequences of their own, so that decode
  /// attention (one query per sequence, its newest token) attends a forward of several tokens per
  /// sequence: token i of sequence b is sequence i·(B+1) + b (B = batch.sequences()), sharing b's block
  /// rows, with b's length less the real tokens after it (0 for a pad: attends nothing, output zero);
  /// sequence i·(B+1) + B is empty, separating tokens (so that every sequence's rows are a CSR range).
  /// Built on the device from `batch`'s device lengths and forward (asynchronous on `stream`;
  /// allocates only when its buffers are too small); the host numbers from `batch`'s. Valid while
  /// `batch` is unchanged (the rows are `batch`'s).
  void expand(const BatchTable& batch, Stream stream);
  /// Sequences `first .. first + count − 1` of this table as a table that views them (no device memory
  /// of its own: valid while this one lives and is unchanged).
  BatchTable slice(int first, int count) const;

 private:
  /// Sets the host lengths and blocks and the device view of a reserved table from first_rows_.
  void lay_out(const std::vector<int32_t>& lengths, const std::vector<int32_t>& held);
  /// The reserved block rows of sequence s, first to last.
  uint32_t row_of(int s, int block) const { return first_rows_.at(static_cast<size_t>(s)) + static_cast<uint32_t>(block); }
  /// Ends the running forward (an edit): its counts are forgotten.
  void end_forward();

  DeviceBatchView view_;
  std::vector<int32_t> lengths_, blocks_, held_, counts_, ranks_;
  int total_blocks_ = 0;
  int last_count_ = 0;
  bool unattended_ = false;
  int reserved_blocks_ = 0;           ///< blocks reserved per sequence (0: an uploaded or expanded table)
  std::vector<uint32_t> first_rows_;  ///< per sequence: the first of its reserved rows
  std::vector<uint32_t> spare_;       ///< first rows of reserved ranges no sequence uses
  DeviceBuffer indptr_, rows_, lengths_buffer_, scratch_rows_, held_buffer_, counts_buffer_, ranks_buffer_;
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
  /// Query heads one CTA serves: 0 (all of its KV head's), or 8: groups of 9–16 query heads per KV head
  /// are then served by two CTAs that each read the KV head's tiles, on the 8-head instance (half the
  /// accumulator registers, so more warps resident; each tile read and, compressed, rebuilt twice).
  int heads_per_cta = 0;
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
/// split of the context over CTAs (one wave over the GPU, at least one block per warp or pair of warps,
/// every CTA of a sequence with the same number of blocks), and holds the workspace the launches need (partial
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
  /// kernel for a compressed cache, the BF16 twin for a BF16 one; over an FP8 cache the same kernels
  /// with its codes widened to their exact BF16 values (GAAC-FP8 slots rebuilt in registers, the plain
  /// FP8 twin's tiles read from shared memory), every score multiplied by `scale` · k_scale of the layer
  /// and the output by v_scale (docs/format.md, section 13). `q` and `out` are device arrays
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

/// Adds `tokens` tokens to every sequence of `batch` (a reserved table), on the device, of which only
/// the real ones count: `valid` is empty (every token real) or sequences × `tokens` flags, sequence
/// after sequence, 0 for a pad token (never stored; write_tokens skips its rows). Each sequence grows
/// by its real tokens, which take its next positions in order. In each layer the tiles of a sliding
/// window's blocks that the forward no longer needs are let go (their references dropped: units pushed
/// on the free stack when no fork holds them; entries absent), every block the new tokens start is
/// opened as a BF16 tail (its tiles' units popped from the free stack and zeroed; in a sliding layer
/// only blocks the window still sees), and the lengths grow. An `attended` forward keeps what its first
/// real token sees until the next begins, so that each of its queries finds its window; an unattended
/// one (its queries attended elsewhere: a prompt over its own rows, a fill) only what its newest token
/// sees (DeviceForwardView::held). With too few free units the tiles that could not be opened stay
/// absent and the status word gets kOutOfUnits: check status() before trusting what follows.
/// Graph-safe without pads: no host sync, no allocation; asynchronous on `stream`. With pads the counts
/// and ranks are copied to the device first (asynchronously on `stream`; allocating when the forward is
/// larger than any before), and a `stream` capturing a CUDA graph is refused (a captured step has every
/// token real). The host keeps the lengths too (for plans); throws, launching nothing, when a sequence
/// would pass its capacity.
GAAC_API void begin_tokens(CacheMemory& cache, BatchTable& batch, int tokens, std::span<const uint8_t> valid,
                           bool attended, Stream stream = nullptr);
/// begin_tokens of `count` real tokens per sequence, unattended (a fill: only what the newest token
/// sees is kept).
GAAC_API void begin_tokens(CacheMemory& cache, BatchTable& batch, int count, Stream stream = nullptr);

/// Writes the K and V rows of the real tokens the last begin_tokens added (of its tokens per sequence,
/// pads skipped) into layer `layer`'s tails. Graph-safe; asynchronous on `stream`.
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

/// KV chunk objects (docs/format.md, section 15) coded on the GPU: the same bytes as gaac::ChunkCodec
/// makes of the same values, from and to chunks and objects in device memory, with no copy through
/// the host (the host reads back only a few bytes: an object's size, a status). Every tile is one
/// warp's; the escape stream is placed by a scan; the checksums are computed on the device, four
/// threads per 4 KiB piece. Thread-safe: calls from many threads (on their own streams) run at once.
/// Each chunk in flight works in device memory the codec keeps for later calls (one workspace per chunk
/// being coded, as large as the largest chunk's needs; freed with the codec). The batch calls code up
/// to kChunksInFlight chunks in the same launches (a chunk a row of each grid) and wait once for them:
/// a batch pays the launches and the host's wait once per kChunksInFlight chunks, not once a chunk.
class GAAC_API ChunkCodec {
 public:
  /// A codec for `calibration`'s chunks on the current device (its bases copied there);
  /// `options.threads` is not used. Throws gaac::Error as gaac::ChunkCodec does.
  explicit ChunkCodec(const CalibrationTable& calibration, ChunkOptions options = {});
  ~ChunkCodec();
  ChunkCodec(const ChunkCodec&) = delete;
  ChunkCodec& operator=(const ChunkCodec&) = delete;

  /// Chunks a batch call has in flight at most (each holds a workspace until the call waits).
  static constexpr size_t kChunksInFlight = 8;

  /// As gaac::ChunkCodec::object_bytes.
  size_t object_bytes(int tokens) const;
  /// Writes the object of `chunk` (device memory; rows 16-byte aligned, strides multiples of 8
  /// elements) stored under `key` to `out` (device memory, `out_bytes` ≥ object_bytes()) and returns
  /// its size, as gaac::ChunkCodec::encode. Synchronises `stream`.
  size_t encode(const ChunkView& chunk, std::string_view key, uint8_t* out, size_t out_bytes, Stream stream = nullptr) const;
  /// encode() of each chunk i under keys[i] into outs[i] (out_bytes[i] long); returns the objects'
  /// sizes. The spans are of one length. A chunk refused is reported (thrown) once the chunks enqueued
  /// with it have run. Synchronises `stream` once per kChunksInFlight chunks.
  std::vector<size_t> encode_batch(std::span<const ChunkView> chunks, std::span<const std::string_view> keys,
                                   std::span<uint8_t* const> outs, std::span<const size_t> out_bytes,
                                   Stream stream = nullptr) const;
  /// Reads the object at the start of `object` (device memory, `object_bytes` long at most) into
  /// `chunk` (device memory, as for encode), after checking everything gaac::ChunkCodec::decode
  /// checks; throws gaac::Error saying what is wrong. Synchronises `stream`.
  void decode(const uint8_t* object, size_t object_bytes, std::string_view key, const MutableChunkView& chunk,
              Stream stream = nullptr) const;
  /// decode() of each object i (object_bytes[i] long at most, stored under keys[i]) into chunks[i]; the
  /// first object found wrong is reported (thrown) once the objects enqueued with it have run, and
  /// says which it is. Synchronises `stream` once per kChunksInFlight chunks.
  void decode_batch(std::span<const uint8_t* const> objects, std::span<const size_t> object_bytes,
                    std::span<const std::string_view> keys, std::span<const MutableChunkView> chunks,
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
/// current device, its sequences grown there each by its own real tokens (begin_tokens, write_tokens,
/// and after the last layer's rows finalize_completed), attended by the fused kernel (the twin for a
/// BF16 cache) with a plan made at the first attend() of each forward: one query per sequence for a
/// decoding step, and for a forward of several tokens (or with pads) every query as a sequence of its
/// own (BatchTable::expand). Edits are BatchTable::select and truncate, CacheMemory::clone. Rows and
/// queries are device arrays. A forward begun unattended keeps only its newest token's sliding windows:
/// attending it raises where a query would need a released block.
GAAC_API std::unique_ptr<BatchKvCache> make_device_batch_kv_cache(const BatchCacheConfig& config);

}  // namespace gaac::cuda
