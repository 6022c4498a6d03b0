// gaac stats: exponent entropy, mode split, bits per element, codec and resident ratios.
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "activity.hpp"
#include "commands.hpp"
#include "common.hpp"
#include "gaac/stats.hpp"
#include "progress.hpp"

namespace gaac::cli {
namespace {

nlohmann::json to_json(const TensorStats& s) {
  return {
      {"ratio", s.ratio()},
      {"resident_ratio", s.resident_ratio()},
      {"bits_per_element", s.bits_per_element()},
      {"exponent_entropy_bits", s.exponent_entropy_bits()},
      {"modes",
       {{"3bit", s.mode_fraction(GroupMode::bits3)},
        {"4bit", s.mode_fraction(GroupMode::bits4)},
        {"raw", s.mode_fraction(GroupMode::raw)}}},
      {"elements", s.elements},
      {"bf16_bytes", s.bf16_bytes()},
      {"codec_bytes", s.codec_bytes},
      {"resident_bytes", s.resident_bytes},
      {"escape_bytes", s.escape_bytes},
      {"tiles", s.tiles},
      {"fallback_tiles", s.fallback_tiles},
      {"fallback_fraction", s.fallback_fraction()},
      {"tail_elements", s.tail_elements},
  };
}

nlohmann::json to_json(const DumpStats& stats, const CalibrationTable& table) {
  nlohmann::json out = to_json(stats.total);
  out["k"] = to_json(stats.k_total);
  out["v"] = to_json(stats.v_total);
  out["calibration_bytes"] = table.bases_bytes();
  nlohmann::json layers = nlohmann::json::array();
  for (size_t l = 0; l < stats.layers.size(); ++l) {
    nlohmann::json k = to_json(stats.layers[l].k);
    nlohmann::json v = to_json(stats.layers[l].v);
    k["escape_capacity_bytes"] = table.escape_capacity(TensorKind::key, static_cast<int>(l));
    v["escape_capacity_bytes"] = table.escape_capacity(TensorKind::value, static_cast<int>(l));
    layers.push_back({{"layer", l}, {"k", k}, {"v", v}});
  }
  out["layers"] = layers;
  return out;
}

std::string row(const std::string& name, const TensorStats& s) {
  return fmt::format("{:<8} {:>7.3f}x {:>8.3f}x {:>9.3f} {:>8.3f} {:>6.2f}% {:>6.2f}% {:>5.2f}% {:>9}\n", name, s.ratio(),
                     s.resident_ratio(), s.bits_per_element(), s.exponent_entropy_bits(),
                     100 * s.mode_fraction(GroupMode::bits3), 100 * s.mode_fraction(GroupMode::bits4),
                     100 * s.mode_fraction(GroupMode::raw), s.fallback_tiles);
}

void print_table(const DumpStats& stats) {
  fmt::print("{:<8} {:>8} {:>9} {:>9} {:>8} {:>7} {:>7} {:>6} {:>9}\n", "tensor", "ratio", "resident", "bits/elem",
             "exp.ent", "3-bit", "4-bit", "raw", "fallbacks");
  for (size_t l = 0; l < stats.layers.size(); ++l) {
    fmt::print("{}", row(fmt::format("{}.k", l), stats.layers[l].k));
    fmt::print("{}", row(fmt::format("{}.v", l), stats.layers[l].v));
  }
  fmt::print("{}{}{}", row("K", stats.k_total), row("V", stats.v_total), row("total", stats.total));
  fmt::print("KV bytes: BF16 {} -> GAAC {} packed, {} resident (slots, raw fallbacks, block table, bases)\n",
             human_bytes(static_cast<double>(stats.total.bf16_bytes())),
             human_bytes(static_cast<double>(stats.total.codec_bytes)),
             human_bytes(static_cast<double>(stats.total.resident_bytes)));
  fmt::print("raw fallback tiles: {} of {} ({:.2f}%)\n", stats.total.fallback_tiles, stats.total.tiles,
             100 * stats.total.fallback_fraction());
}

}  // namespace

void add_stats(CLI::App& app) {
  auto* cmd = app.add_subcommand("stats", "Compression statistics of a KV dump, per layer and K/V and in total");
  auto input = std::make_shared<std::string>();
  auto calib = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("input", *input, "KV dump (.safetensors)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--calib", *calib, "Calibration table (default: calibrate on the input itself)")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--json", *json, "Print JSON instead of a table");
  cmd->footer(
      "ratio: BF16 bytes / compressed bytes with slots packed exactly. resident: BF16 bytes / bytes held in a\n"
      "cache with fixed-capacity slots, raw fallback tiles, 4-byte block-table entries and the bases.\n"
      "Incomplete final 16-token blocks count as raw BF16 in both.");
  cmd->callback([input, calib, json] {
    const KvDump dump = load_dump(*input);
    const CalibrationTable table = calibration_for(dump, *input, *calib);
    DumpStats stats;
    {
      const Activity activity("measuring " + *input);
      ProgressBar bar("measuring");
      stats = measure(dump, table, std::ref(bar));
    }
    if (*json) {
      fmt::print("{}\n", to_json(stats, table).dump(2));
    } else {
      print_table(stats);
    }
    if (!calib->empty()) fmt::print(stderr, "{}", raw_tiles_note(stats.total.fallback_fraction(), *calib));
  });
}

}  // namespace gaac::cli
