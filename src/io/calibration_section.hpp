// A calibration table as a .gaac snapshot's calibration section holds it (docs/format.md, section 11):
// what snapshots store and what a KV chunk object's calibration id hashes.
#pragma once

#include <cstdint>
#include <vector>

#include "gaac/calibration.hpp"

namespace gaac::io {

/// The bases k.b3, k.b4, v.b3, v.b4 (each layers × kv_heads × head_dim bytes), then the escape
/// capacities as u16, every layer's for K then for V.
std::vector<uint8_t> calibration_section(const CalibrationTable& calibration);

}  // namespace gaac::io
