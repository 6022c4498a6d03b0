// What every gaac CUDA kernel is handed: a paged cache's memory on the device and a batch's sequence
// table there, as plain pointers (docs/format.md, section 13), and which variant of decode attention runs. Plain data only, like paged_layout.hpp:
// includable from device code. gaac::cuda::CacheMemory and BatchTable own what these point to.
#pragma once

#include <cstdint>

#include "gaac/paged_layout.hpp"

namespace gaac::cuda {

/// A paged cache's memory on the device as every kernel reads and writes it (device pointers; the
/// layout of docs/format.md, section 13).
struct DeviceCacheView {
  PagedGeometry geometry;
  uint8_t* units = nullptr;               ///< the unit pool, padded by 16 bytes
  uint32_t* entries = nullptr;            ///< the block table
  const uint8_t* bases = nullptr;         ///< calibrated bases (PagedGeometry::bases_index); null for BF16
  const uint32_t* lane_bases = nullptr;   ///< the bases as the decode kernel's lanes read them; null for BF16
  const int32_t* windows = nullptr;       ///< per layer: sliding window in tokens, 0 for full attention
  uint32_t* free_stack = nullptr;         ///< free units, room for every unit
  uint32_t* free_count = nullptr;         ///< units on the free stack
  uint32_t* status = nullptr;             ///< sticky status word (CacheMemory::kOutOfUnits)
  /// Per unit: the block-table entries holding it as a tile's (first) unit. Forks share tiles; a tile's
  /// units go back on the free stack when the last entry holding it lets go.
  uint32_t* refs = nullptr;
  /// FP8 caches: bit u % 32 of word u / 32 is set when unit u is a tile's (first) unit and the tile holds
  /// a NaN or infinity code (widened through `widening` rather than by bit placement). Null otherwise.
  const uint32_t* special = nullptr;
  /// FP8 caches: the exact BF16 value of each of the 256 codes of the cache's format. Null otherwise.
  const uint16_t* widening = nullptr;
};

/// A batch's sequence table on the device as kernels read it (CSR, as gaac::SequenceTableView).
struct DeviceBatchView {
  int sequences = 0;
  const int32_t* indptr = nullptr;  ///< sequences + 1 block offsets
  const uint32_t* rows = nullptr;   ///< block rows of every sequence's blocks (kNoRow: none held)
  int32_t* lengths = nullptr;       ///< tokens per sequence; grown on the device by begin_tokens
};

/// The tokens of a batch's running forward as the growth kernels read them (BatchTable::forward_view()):
/// how many real tokens each sequence adds and which positions they take. Pad tokens are never stored.
struct DeviceForwardView {
  int tokens = 0;                   ///< tokens per sequence of the forward, pads included
  const int32_t* counts = nullptr;  ///< per sequence: its real tokens (null: every token real, `tokens` each)
  /// `[sequences][tokens]`: a token's rank among its sequence's real tokens of the forward, −1 for a pad
  /// (null: every token real, token j of rank j). A real token's position is the sequence's length
  /// before the forward plus its rank.
  const int32_t* ranks = nullptr;
  /// Per sequence: the length whose newest token's sliding windows the sequence keeps (every block
  /// before them is released). A forward keeps what its first real query attends until the next one
  /// begins; an `unattended` one, only what its newest token attends.
  int32_t* held = nullptr;
  /// 1 when the forward's queries are attended elsewhere (a prompt over its own rows, a fill): its
  /// sliding layers keep only the window of its newest token.
  int unattended = 0;
};

/// Which parts of decode attention a launch does; anything but `full` is for time breakdowns and
/// leaves the output meaningless.
enum class Work : uint8_t {
  full = 0,       ///< attention
  no_math = 1,    ///< load tiles and rebuild operand registers, no products or softmax
  no_decode = 2,  ///< load tiles and multiply their stored words as they are (compressed caches only)
  load_only = 3,  ///< bring tiles to shared memory only
};

}  // namespace gaac::cuda
