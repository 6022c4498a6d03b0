// gaac study: the measurements behind the paper's design choices, on any KV dump.
//   gaac study schemes EVAL --calib-kv KV...   what each mode scheme stores (paper Table 4)
//   gaac study drift EVAL --calib TABLE        escape bytes by token position (paper Table 8)
#include <fmt/core.h>

#include <algorithm>
#include <memory>
#include <variant>

#include "activity.hpp"
#include "commands.hpp"
#include "common.hpp"
#include "gaac/error.hpp"
#include "gaac/studies.hpp"
#include "numbers.hpp"

namespace gaac::cli {
namespace {

/// Refuses a calibration dump whose geometry or element format differs from the evaluated one's, naming
/// both files.
template <class Dump>
void check_same_model(const Dump& dump, const std::string& path, const Dump& evaluated, const std::string& input) {
  if (format_of(dump) != format_of(evaluated)) {
    throw Error(fmt::format("{}: the KV dump is {}, but the evaluated dump {} is {}", path, to_string(format_of(dump)), input,
                            to_string(format_of(evaluated))));
  }
  if (dump.layers.size() == evaluated.layers.size() && dump.kv_heads() == evaluated.kv_heads() &&
      dump.head_dim() == evaluated.head_dim()) {
    return;
  }
  throw Error(fmt::format("{}: the KV dump has {}, but the evaluated dump {} has {}; calibrate on dumps of the same model",
                          path, geometry_text(dump.layers.size(), dump.kv_heads(), dump.head_dim()), input,
                          geometry_text(evaluated.layers.size(), evaluated.kv_heads(), evaluated.head_dim())));
}

/// The schemes of a dump's element format: the paper's for BF16, format.md's for FP8.
std::vector<ModeScheme> schemes_for(const KvDump&) { return paper_mode_schemes(); }
std::vector<ModeScheme> schemes_for(const Fp8KvDump& dump) { return fp8_mode_schemes(dump.format); }

template <class Dump>
std::vector<ModeSchemeResult> compare(const Dump& evaluated, const std::string& input, const std::vector<std::string>& calib_paths) {
  std::vector<Dump> calibration;
  for (const auto& p : calib_paths) {
    io::AnyKvDump any = load_any_dump(p);
    if (!std::holds_alternative<Dump>(any)) {
      throw Error(fmt::format("{}: the KV dump is {}, but the evaluated dump {} is {}", p,
                              std::visit([](const auto& d) { return to_string(format_of(d)); }, any), input,
                              to_string(format_of(evaluated))));
    }
    calibration.push_back(std::get<Dump>(std::move(any)));
    check_same_model(calibration.back(), p, evaluated, input);
  }
  std::vector<const Dump*> dumps;
  for (const auto& d : calibration) dumps.push_back(&d);
  if (dumps.empty()) dumps.push_back(&evaluated);
  const auto schemes = schemes_for(evaluated);
  const Activity activity("comparing mode schemes on " + input);
  return compare_mode_schemes(std::span<const Dump* const>(dumps), evaluated, schemes);
}

void run_schemes(const std::string& input, const std::vector<std::string>& calib_paths) {
  const io::AnyKvDump evaluated = load_any_dump(input);
  const auto results = std::visit([&](const auto& d) { return compare(d, input, calib_paths); }, evaluated);
  fmt::print("| scheme | ratio | bits/elem | groups per mode |\n|---|---|---|---|\n");
  for (const auto& r : results) {
    std::string split;
    for (size_t i = 0; i < r.fractions.size(); ++i) {
      const std::string mode = i < r.scheme.widths.size() ? fmt::format("{}-bit", r.scheme.widths[i]) : "raw";
      split += fmt::format("{}{} {:.2f}%", i ? ", " : "", mode, 100 * r.fractions[i]);
    }
    fmt::print("| {} | {:.3f} | {:.3f} | {} |\n", r.scheme.name, r.ratio, r.bits_per_element, split);
  }
}

template <class Dump>
void drift_of(const Dump& dump, const std::string& input, const std::string& calib, int segment, int layer) {
  if (dump.layers.empty()) throw Error(input + ": the KV dump has no layers");
  if (layer >= static_cast<int>(dump.layers.size())) {
    throw Error(fmt::format("--layer {}: the KV dump {} has {} layers (0 to {})", layer, input, dump.layers.size(),
                            dump.layers.size() - 1));
  }
  const CalibrationTable table = calibration_for(dump, input, calib);
  const Activity activity("measuring escapes by position in " + input);
  const auto segments = escape_bytes_by_segment(dump, table, segment);
  const auto heads = static_cast<size_t>(dump.kv_heads());
  // Per segment: the largest mean over the heads of the chosen layer (as the paper reports), and the
  // mean over every layer and head.
  fmt::print("| tokens | K, layer {} (max over heads) | V, layer {} (max over heads) | K, all layers | V, all layers |\n",
             layer, layer);
  fmt::print("|---|---|---|---|---|\n");
  for (const auto& s : segments) {
    double layer_max[2] = {0, 0}, all[2] = {0, 0};
    for (size_t k = 0; k < 2; ++k) {
      const auto& m = s.mean_escape_bytes[k];
      for (size_t h = 0; h < heads; ++h) layer_max[k] = std::max(layer_max[k], m[static_cast<size_t>(layer) * heads + h]);
      for (double v : m) all[k] += v;
      all[k] /= static_cast<double>(m.size());
    }
    fmt::print("| {}–{} | {:.1f} | {:.1f} | {:.1f} | {:.1f} |\n", s.first_token, s.end_token, layer_max[0], layer_max[1],
               all[0], all[1]);
  }
}

void run_drift(const std::string& input, const std::string& calib, int segment, int layer) {
  std::visit([&](const auto& d) { drift_of(d, input, calib, segment, layer); }, load_any_dump(input));
}

}  // namespace

void add_study(CLI::App& app) {
  auto* cmd = app.add_subcommand("study", "Measurements behind the format's design (the paper's Tables 4 and 8)");
  cmd->require_subcommand(1);

  auto* schemes = cmd->add_subcommand(
      "schemes", "Bits per element under the mode schemes 2+3+4+raw, 3+4+raw (GAAC) and 4+raw (paper Table 4); for an FP8 "
                 "dump, format.md's FP8 schemes (2+3+raw is GAAC-FP8's)");
  auto input = std::make_shared<std::string>();
  auto calib_kv = std::make_shared<std::vector<std::string>>();
  schemes->add_option("input", *input, "KV dump to evaluate (.safetensors)")->required()->check(CLI::ExistingFile);
  schemes->add_option("--calib-kv", *calib_kv, "KV dumps the windows are calibrated on (default: the input)")
      ->check(CLI::ExistingFile);
  schemes->footer(
      "Windows of 4, 8 and 16 exponents are chosen per channel as calibration chooses GAAC's; each group takes the\n"
      "narrowest mode of the scheme holding its eight exponents. Sizes are the exact bits of such a stream\n"
      "(8 sign+mantissa bits, 2/8 tag bits and the exponent width per element), without slots or bases. FP8\n"
      "dumps: windows of 2, 4, 8 (and 16) exponents, M + 1 sign+mantissa bits, raw groups X bits; the ratio is\n"
      "over the FP8 bytes.");
  schemes->callback([input, calib_kv] { run_schemes(*input, *calib_kv); });

  auto* drift = cmd->add_subcommand("drift", "Mean escape bytes per tile by token-position segment (paper Table 8)");
  auto drift_input = std::make_shared<std::string>();
  auto calib = std::make_shared<std::string>();
  auto segment = std::make_shared<int>(1024);
  auto layer = std::make_shared<int>(5);
  drift->add_option("input", *drift_input, "KV dump (.safetensors)")->required()->check(CLI::ExistingFile);
  drift->add_option("--calib", *calib, "Calibration table (default: calibrate on the input itself)")
      ->check(CLI::ExistingFile);
  drift->add_option("--segment", *segment, "Tokens per segment, a multiple of 16")
      ->capture_default_str()
      ->transform(number_in(16, 1 << 24))
      ->check(CLI::Validator(
          [](std::string& text) {
            return std::stoi(text) % 16 == 0 ? std::string() : text + " is not a multiple of 16";
          },
          "a multiple of 16"));
  drift->add_option("--layer", *layer, "Layer whose heads the first two columns report")
      ->capture_default_str()
      ->transform(number_in(0, 1 << 20));
  drift->callback([drift_input, calib, segment, layer] { run_drift(*drift_input, *calib, *segment, *layer); });
}

}  // namespace gaac::cli
