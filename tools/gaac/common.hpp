// Helpers shared by the subcommands.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "gaac/calibration.hpp"
#include "gaac/fp8_dump.hpp"
#include "gaac/kv_dump.hpp"
#include "io/kv_dump_file.hpp"
#include "model/thread_pool.hpp"

namespace gaac::cli {

/// Loads a KV dump; errors name the file.
KvDump load_dump(const std::string& path);

/// Loads a KV dump of either element type (BF16, or FP8: F8_E4M3 / F8_E5M2); errors name the file.
io::AnyKvDump load_any_dump(const std::string& path);

/// The element format of a dump.
inline ElementFormat format_of(const KvDump&) { return ElementFormat::bf16; }
inline ElementFormat format_of(const Fp8KvDump& dump) { return dump.format; }

/// "3 layers × 2 KV heads × head_dim 256".
std::string geometry_text(size_t layers, int kv_heads, int head_dim);

/// The calibration at `calib_path`, or (when empty) one calibrated on `dump` itself. A table made
/// for another geometry is refused with a message naming both files.
CalibrationTable calibration_for(const KvDump& dump, const std::string& dump_path, const std::string& calib_path);
/// The same for an FP8 dump; a table for another element format is refused too.
CalibrationTable calibration_for(const Fp8KvDump& dump, const std::string& dump_path, const std::string& calib_path);

/// Adds the `-t,--threads` option: 0 (the default) means one thread per available CPU; negative
/// counts and counts above model::ThreadPool::max_threads() are refused while parsing.
CLI::Option* add_threads_option(CLI::App* cmd, int& threads);

/// Starts the engine's threads for `--threads threads`; a failure names the option.
std::unique_ptr<model::ThreadPool> start_threads(int threads);

/// "12.3 MiB"-style size.
std::string human_bytes(double bytes);

/// The share of tiles falling back to raw above which a command says the calibration does not fit
/// the values.
inline constexpr double kManyRawTiles = 0.05;

/// A note for stderr when `fraction` of the tiles fell back to raw under the calibration named
/// `calibration`: how to calibrate on one's own values (empty below kManyRawTiles).
std::string raw_tiles_note(double fraction, const std::string& calibration);

}  // namespace gaac::cli
