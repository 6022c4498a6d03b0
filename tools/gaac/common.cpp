#include "common.hpp"

#include <fmt/core.h>

#include "activity.hpp"
#include "gaac/error.hpp"
#include "io/kv_dump_file.hpp"
#include "numbers.hpp"
#include "progress.hpp"

namespace gaac::cli {

KvDump load_dump(const std::string& path) {
  const Activity activity("reading the KV dump " + path);
  return io::load_kv_dump(path);
}

io::AnyKvDump load_any_dump(const std::string& path) {
  const Activity activity("reading the KV dump " + path);
  return io::load_any_kv_dump(path);
}

std::string geometry_text(size_t layers, int kv_heads, int head_dim) {
  return fmt::format("{} layers × {} KV heads × head_dim {}", layers, kv_heads, head_dim);
}

namespace {

template <class Dump>
CalibrationTable calibration_of(const Dump& dump, const std::string& dump_path, const std::string& calib_path) {
  if (!calib_path.empty()) {
    CalibrationTable table = [&] {
      const Activity activity("reading the calibration table " + calib_path);
      return load_calibration(calib_path);
    }();
    if (static_cast<int>(dump.layers.size()) != table.layers() || dump.kv_heads() != table.kv_heads() ||
        dump.head_dim() != table.head_dim()) {
      throw Error(fmt::format("{}: the calibration is for {}, but the KV dump {} has {}; use a calibration "
                              "table made from dumps of the same model",
                              calib_path,
                              geometry_text(static_cast<size_t>(table.layers()), table.kv_heads(), table.head_dim()),
                              dump_path, geometry_text(dump.layers.size(), dump.kv_heads(), dump.head_dim())));
    }
    if (table.element_format() != format_of(dump)) {
      throw Error(fmt::format("{}: the calibration is for {} elements, but the KV dump {} is {}; calibrate on dumps of "
                              "the same format",
                              calib_path, to_string(table.element_format()), dump_path, to_string(format_of(dump))));
    }
    return table;
  }
  if (dump.layers.empty()) throw Error(dump_path + ": the KV dump has no layers, so there is nothing to calibrate on");
  const Activity activity("calibrating on " + dump_path);
  ProgressBar bar("calibrating");
  const Dump* dumps[] = {&dump};
  CalibrationTable table = calibrate(std::span<const Dump* const>(dumps), std::ref(bar));
  table.metadata()["source"] = "self-calibrated";
  return table;
}

}  // namespace

CalibrationTable calibration_for(const KvDump& dump, const std::string& dump_path, const std::string& calib_path) {
  return calibration_of(dump, dump_path, calib_path);
}

CalibrationTable calibration_for(const Fp8KvDump& dump, const std::string& dump_path, const std::string& calib_path) {
  return calibration_of(dump, dump_path, calib_path);
}

CLI::Option* add_threads_option(CLI::App* cmd, int& threads) {
  const int cpus = model::ThreadPool::available_threads();
  return cmd->add_option("-t,--threads", threads, "Threads (0: one per available CPU)")
      ->capture_default_str()
      ->transform(number_in<int>(0, model::ThreadPool::max_threads(),
                                 fmt::format("{} per available CPU; this machine has {}",
                                             model::ThreadPool::kMaxThreadsPerCpu, cpus)));
}

std::unique_ptr<model::ThreadPool> start_threads(int threads) {
  try {
    return std::make_unique<model::ThreadPool>(threads);
  } catch (const Error& e) {
    throw e.with_context("--threads " + std::to_string(threads) + " (give fewer threads)");
  }
}

std::string raw_tiles_note(double fraction, const std::string& calibration) {
  if (fraction <= kManyRawTiles) return "";
  return fmt::format(
      "gaac: {:.1f}% of the tiles fell back to raw BF16: the exponent windows of {} do not fit these values. Calibrate "
      "on values like them (gaac capture -m MODEL --text YOUR_TEXT -o KV.safetensors; gaac calibrate KV.safetensors -o "
      "CALIB.safetensors) and pass --calib CALIB.safetensors\n",
      100 * fraction, calibration);
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) {
    bytes /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} {}", bytes, units[u]) : fmt::format("{:.2f} {}", bytes, units[u]);
}

}  // namespace gaac::cli
