#include "common.hpp"

#include <fmt/core.h>

#include "progress.hpp"

namespace gaac::cli {

KvDump load_dump(const std::string& path) { return load_kv_dump(path); }

CalibrationTable calibration_for(const KvDump& dump, const std::string& calib_path) {
  if (!calib_path.empty()) {
    CalibrationTable table = load_calibration(calib_path);
    table.check_matches(dump);
    return table;
  }
  ProgressBar bar("calibrating");
  const KvDump* dumps[] = {&dump};
  CalibrationTable table = calibrate(dumps, std::ref(bar));
  table.metadata()["source"] = "self-calibrated";
  return table;
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} {}", bytes, units[u]) : fmt::format("{:.2f} {}", bytes, units[u]);
}

}  // namespace gaac::cli
