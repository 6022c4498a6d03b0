// gaac calibrate: learns exponent windows and slot capacities from sample KV dumps.
#include <fmt/core.h>

#include <algorithm>
#include <variant>

#include "activity.hpp"
#include "commands.hpp"
#include "common.hpp"
#include "gaac/error.hpp"
#include "io/output_file.hpp"
#include "progress.hpp"
#include "terminal_text.hpp"

namespace gaac::cli {
namespace {

/// The shape and element format every input must share.
struct Geometry {
  size_t layers;
  int kv_heads, head_dim;
  ElementFormat format;
  bool operator==(const Geometry&) const = default;
};

Geometry geometry_of(const io::AnyKvDump& any) {
  return std::visit([](const auto& d) { return Geometry{d.layers.size(), d.kv_heads(), d.head_dim(), format_of(d)}; }, any);
}

/// Refuses a dump whose geometry or element format differs from the first input's, naming both files.
void check_same_model(const io::AnyKvDump& dump, const std::string& path, const Geometry& first, const std::string& first_path) {
  const Geometry g = geometry_of(dump);
  if (g == first) return;
  if (g.format != first.format) {
    throw Error(fmt::format("{}: the KV dump is {}, but the first input {} is {}; calibrate on dumps of one element format",
                            path, to_string(g.format), first_path, to_string(first.format)));
  }
  throw Error(fmt::format("{}: the KV dump has {}, but the first input {} has {}; calibrate on dumps of one model",
                          path, geometry_text(g.layers, g.kv_heads, g.head_dim), first_path,
                          geometry_text(first.layers, first.kv_heads, first.head_dim)));
}

void run(const std::vector<std::string>& inputs, const std::string& output) {
  io::check_output(output, inputs);  // before the work: a bad output fails at once
  // Two streaming passes, one dump in memory at a time: exponent histograms, then escape sizes.
  std::unique_ptr<Calibrator> calibrator;
  Geometry first{};
  for (size_t i = 0; i < inputs.size(); ++i) {
    const io::AnyKvDump dump = load_any_dump(inputs[i]);
    const Geometry g = geometry_of(dump);
    if (g.layers == 0) throw Error(inputs[i] + ": the KV dump has no layers");
    if (!calibrator) {
      const Activity activity("preparing the calibration");
      calibrator = std::make_unique<Calibrator>(static_cast<int>(g.layers), g.kv_heads, g.head_dim, g.format);
      first = g;
    }
    check_same_model(dump, inputs[i], first, inputs[0]);
    const Activity activity("counting the exponents of " + inputs[i]);
    ProgressBar bar(fmt::format("histograms {}/{}", i + 1, inputs.size()));
    std::visit([&](const auto& d) { calibrator->add_exponents(d, std::ref(bar)); }, dump);
  }
  CalibrationTable table = calibrator->choose_windows();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const io::AnyKvDump dump = load_any_dump(inputs[i]);
    check_same_model(dump, inputs[i], first, inputs[0]);  // the file may have changed since the first pass
    const Activity activity("measuring the escapes of " + inputs[i]);
    ProgressBar bar(fmt::format("escape sizes {}/{}", i + 1, inputs.size()));
    std::visit([&](const auto& d) { calibrator->add_escape_sizes(d, table, std::ref(bar)); }, dump);
  }
  calibrator->choose_capacities(table);
  std::string sources;
  for (const auto& p : inputs) sources += (sources.empty() ? "" : ",") + printable(p);  // labels, kept as text
  table.metadata()["source"] = sources;
  {
    const Activity activity("writing " + output);
    save_calibration(table, output, inputs);
  }

  fmt::print("calibrated on {} file(s) of {}, {} tokens summed over layers\n", inputs.size(), to_string(first.format),
             calibrator->tokens_seen());
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    size_t lo = SIZE_MAX, hi = 0;
    for (int l = 0; l < table.layers(); ++l) {
      lo = std::min(lo, table.escape_capacity(kind, l));
      hi = std::max(hi, table.escape_capacity(kind, l));
    }
    fmt::print("{} escape-slot capacity: {}..{} bytes per tile\n", kind == TensorKind::key ? "K" : "V", lo, hi);
  }
  fmt::print("wrote {}\n", output);
}

}  // namespace

void add_calibrate(CLI::App& app) {
  auto* cmd = app.add_subcommand("calibrate", "Learn exponent windows and escape-slot capacities from KV dumps");
  auto inputs = std::make_shared<std::vector<std::string>>();
  auto output = std::make_shared<std::string>();
  cmd->add_option("inputs", *inputs, "KV dumps (.safetensors), all of one model and element format (BF16 or FP8)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("-o,--output", *output, "Calibration table to write (.safetensors)")->required();
  cmd->callback([inputs, output] { run(*inputs, *output); });
}

}  // namespace gaac::cli
