// gaac stats: exponent entropy, mode split, bits per element, codec and resident ratios.
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include <array>
#include <variant>

#include "activity.hpp"
#include "commands.hpp"
#include "common.hpp"
#include "gaac/stats.hpp"
#include "progress.hpp"

namespace gaac::cli {
namespace {

/// The names of the three modes of a format's groups: 3bit, 4bit, raw (BF16) or 2bit, 3bit, raw (FP8).
std::array<const char*, 3> mode_names(ElementFormat format) {
  if (is_fp8(format)) return {"2bit", "3bit", "raw"};
  return {"3bit", "4bit", "raw"};
}

nlohmann::json to_json(const TensorStats& s) {
  const auto names = mode_names(s.format);
  nlohmann::json out = {
      {"ratio", s.ratio()},
      {"resident_ratio", s.resident_ratio()},
      {"bits_per_element", s.bits_per_element()},
      {"exponent_entropy_bits", s.exponent_entropy_bits()},
      {"modes",
       {{names[0], s.mode_fraction(GroupMode::bits3)},
        {names[1], s.mode_fraction(GroupMode::bits4)},
        {names[2], s.mode_fraction(GroupMode::raw)}}},
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
  if (is_fp8(s.format)) {
    // ratio and resident_ratio are over the FP8 bytes; these over the same values in BF16 (Table 7).
    out["element_format"] = to_string(s.format);
    out["fp8_bytes"] = s.source_bytes();
    out["ratio_vs_bf16"] = s.ratio_vs_bf16();
    out["resident_ratio_vs_bf16"] = static_cast<double>(s.bf16_bytes()) / static_cast<double>(s.resident_bytes);
  }
  return out;
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
  const bool fp8 = is_fp8(stats.total.format);
  fmt::print("{:<8} {:>8} {:>9} {:>9} {:>8} {:>7} {:>7} {:>6} {:>9}\n", "tensor", "ratio", "resident", "bits/elem",
             "exp.ent", fp8 ? "2-bit" : "3-bit", fp8 ? "3-bit" : "4-bit", "raw", "fallbacks");
  for (size_t l = 0; l < stats.layers.size(); ++l) {
    fmt::print("{}", row(fmt::format("{}.k", l), stats.layers[l].k));
    fmt::print("{}", row(fmt::format("{}.v", l), stats.layers[l].v));
  }
  fmt::print("{}{}{}", row("K", stats.k_total), row("V", stats.v_total), row("total", stats.total));
  if (fp8) {
    const TensorStats& t = stats.total;
    fmt::print("KV bytes: {} {} -> GAAC-FP8 {} packed, {} resident (slots, raw fallbacks, block table, bases); "
               "the same values in BF16: {} ({:.3f}x packed, {:.3f}x resident)\n",
               to_string(t.format), human_bytes(static_cast<double>(t.source_bytes())), human_bytes(static_cast<double>(t.codec_bytes)),
               human_bytes(static_cast<double>(t.resident_bytes)), human_bytes(static_cast<double>(t.bf16_bytes())),
               t.ratio_vs_bf16(), static_cast<double>(t.bf16_bytes()) / static_cast<double>(t.resident_bytes));
  } else {
    fmt::print("KV bytes: BF16 {} -> GAAC {} packed, {} resident (slots, raw fallbacks, block table, bases)\n",
               human_bytes(static_cast<double>(stats.total.bf16_bytes())),
               human_bytes(static_cast<double>(stats.total.codec_bytes)),
               human_bytes(static_cast<double>(stats.total.resident_bytes)));
  }
  fmt::print("raw fallback tiles: {} of {} ({:.2f}%)\n", stats.total.fallback_tiles, stats.total.tiles,
             100 * stats.total.fallback_fraction());
}

}  // namespace

void add_stats(CLI::App& app) {
  auto* cmd = app.add_subcommand("stats", "Compression statistics of a KV dump, per layer and K/V and in total");
  auto input = std::make_shared<std::string>();
  auto calib = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("input", *input, "KV dump (.safetensors): BF16, or FP8 (F8_E4M3 / F8_E5M2)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--calib", *calib, "Calibration table (default: calibrate on the input itself)")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--json", *json, "Print JSON instead of a table");
  cmd->footer(
      "ratio: BF16 bytes / compressed bytes with slots packed exactly. resident: BF16 bytes / bytes held in a\n"
      "cache with fixed-capacity slots, raw fallback tiles, 4-byte block-table entries and the bases.\n"
      "Incomplete final 16-token blocks count as raw BF16 in both. For an FP8 dump both are over its FP8\n"
      "bytes (modes 2-bit, 3-bit, raw), and the summary gives them over the same values in BF16 too.");
  cmd->callback([input, calib, json] {
    const io::AnyKvDump dump = load_any_dump(*input);
    CalibrationTable table;
    DumpStats stats;
    std::visit(
        [&](const auto& d) {
          table = calibration_for(d, *input, *calib);
          const Activity activity("measuring " + *input);
          ProgressBar bar("measuring");
          stats = measure(d, table, std::ref(bar));
        },
        dump);
    if (*json) {
      fmt::print("{}\n", to_json(stats, table).dump(2));
    } else {
      print_table(stats);
    }
    if (!calib->empty()) fmt::print(stderr, "{}", raw_tiles_note(stats.total.fallback_fraction(), *calib));
  });
}

}  // namespace gaac::cli
