// gaac calibrate: learns exponent windows and slot capacities from sample KV dumps.
#include <fmt/core.h>

#include <algorithm>

#include "commands.hpp"
#include "common.hpp"
#include "gaac/error.hpp"
#include "progress.hpp"

namespace gaac::cli {
namespace {

void run(const std::vector<std::string>& inputs, const std::string& output) {
  // Two streaming passes, one dump in memory at a time: exponent histograms, then escape sizes.
  std::unique_ptr<Calibrator> calibrator;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const KvDump dump = load_dump(inputs[i]);
    if (dump.layers.empty()) throw Error(inputs[i] + ": the KV dump has no layers");
    if (!calibrator) {
      calibrator = std::make_unique<Calibrator>(static_cast<int>(dump.layers.size()), dump.kv_heads(), dump.head_dim());
    }
    ProgressBar bar(fmt::format("histograms {}/{}", i + 1, inputs.size()));
    calibrator->add_exponents(dump, std::ref(bar));
  }
  CalibrationTable table = calibrator->choose_windows();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const KvDump dump = load_dump(inputs[i]);
    ProgressBar bar(fmt::format("escape sizes {}/{}", i + 1, inputs.size()));
    calibrator->add_escape_sizes(dump, table, std::ref(bar));
  }
  calibrator->choose_capacities(table);
  std::string sources;
  for (const auto& p : inputs) sources += (sources.empty() ? "" : ",") + p;
  table.metadata()["source"] = sources;
  save_calibration(table, output);

  fmt::print("calibrated on {} file(s), {} tokens summed over layers\n", inputs.size(), calibrator->tokens_seen());
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
  cmd->add_option("inputs", *inputs, "KV dumps (.safetensors), all of one model")->required()->check(CLI::ExistingFile);
  cmd->add_option("-o,--output", *output, "Calibration table to write (.safetensors)")->required();
  cmd->callback([inputs, output] { run(*inputs, *output); });
}

}  // namespace gaac::cli
