// The .gaac KV snapshot: a lossless, compressed copy of a whole KV dump with its calibration.
// Layout in docs/format.md ("Snapshot container").
#pragma once

#include "gaac/export.h"

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "gaac/calibration.hpp"
#include "gaac/fp8_dump.hpp"
#include "gaac/kv_dump.hpp"

namespace gaac {

/// Version of the container layout written by this library: 2, which names the element format (BF16 or
/// FP8). Readers also take version 1 (BF16 only).
inline constexpr uint16_t kSnapshotVersion = 2;

/// What a snapshot of a BF16 dump holds.
struct GAAC_API Snapshot {
  KvDump dump;
  CalibrationTable calibration;
};

/// What a snapshot of an FP8 dump holds (its scales included).
struct GAAC_API Fp8Snapshot {
  Fp8KvDump dump;
  CalibrationTable calibration;
};

/// A snapshot of either kind.
using AnySnapshot = std::variant<Snapshot, Fp8Snapshot>;

/// Builds the complete .gaac image of `dump`, compressed with `calibration` (which must match it).
GAAC_API std::vector<uint8_t> snapshot_image(const KvDump& dump, const CalibrationTable& calibration, const Progress& progress = {});

/// Makes the tensor section (docs/format.md, section 11) of one (layer, K or V) of a snapshot.
using TensorSectionEncoder = std::function<std::vector<uint8_t>(int layer, TensorKind kind)>;

/// snapshot_image() with the tensor sections made by `encode` (another executor of the codec, such
/// as the GPU's) and everything else, the container included, made here.
GAAC_API std::vector<uint8_t> snapshot_image(const KvDump& dump, const CalibrationTable& calibration,
                                             const TensorSectionEncoder& encode, const Progress& progress = {});

/// The .gaac image of an FP8 dump, compressed with an FP8 table of its format (docs/format.md, section 14.8).
GAAC_API std::vector<uint8_t> snapshot_image(const Fp8KvDump& dump, const CalibrationTable& calibration, const Progress& progress = {});

/// Writes a .gaac file (to a temporary name, then renamed into place).
GAAC_API void write_snapshot(const KvDump& dump, const CalibrationTable& calibration, const std::string& path,
                    const Progress& progress = {});
/// The same for an FP8 dump.
GAAC_API void write_snapshot(const Fp8KvDump& dump, const CalibrationTable& calibration, const std::string& path,
                             const Progress& progress = {});

/// Parses and fully validates a .gaac image of a BF16 dump: sizes, offsets, checksums, calibration,
/// every tile. A truncated, corrupted or hostile image, or one of an FP8 dump, throws gaac::Error saying
/// what is wrong and where; nothing outside `image` is ever read.
GAAC_API Snapshot parse_snapshot(std::span<const uint8_t> image, const std::string& label, const Progress& progress = {});

/// parse_snapshot for images of either element format.
GAAC_API AnySnapshot parse_any_snapshot(std::span<const uint8_t> image, const std::string& label, const Progress& progress = {});

/// Reads and parses a .gaac file of a BF16 dump.
GAAC_API Snapshot read_snapshot(const std::string& path, const Progress& progress = {});

/// Reads and parses a .gaac file of either element format.
GAAC_API AnySnapshot read_any_snapshot(const std::string& path, const Progress& progress = {});

/// The bytes of a .gaac file, not parsed; a file that does not start as a snapshot is refused as soon
/// as its first bytes are read (a stream such as /dev/zero is not read on). Throws gaac::Error.
GAAC_API std::vector<uint8_t> read_snapshot_image(const std::string& path);

}  // namespace gaac
