// Helpers shared by the subcommands.
#pragma once

#include <string>

#include "gaac/calibration.hpp"
#include "gaac/kv_dump.hpp"

namespace gaac::cli {

/// Loads a KV dump with a progress-free message on failure naming the file.
KvDump load_dump(const std::string& path);

/// The calibration at `calib_path`, or (when empty) one calibrated on `dump` itself.
CalibrationTable calibration_for(const KvDump& dump, const std::string& calib_path);

/// "12.3 MiB"-style size.
std::string human_bytes(double bytes);

}  // namespace gaac::cli
