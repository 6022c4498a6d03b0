// gaac verify: compresses and restores a KV dump in memory; succeeds only if every bit survives.
#include <fmt/core.h>

#include "activity.hpp"
#include "commands.hpp"
#include "common.hpp"
#include "gaac/snapshot.hpp"
#include "progress.hpp"

namespace gaac::cli {
namespace {

/// Describes the first element where two tensors differ, or returns an empty string.
std::string first_difference(const KvTensor& want, const KvTensor& got) {
  if (want.tokens != got.tokens || want.kv_heads != got.kv_heads || want.head_dim != got.head_dim) return "shape differs";
  for (size_t i = 0; i < want.data.size(); ++i) {
    if (want.data[i] != got.data[i]) {
      const size_t per_token = static_cast<size_t>(want.kv_heads) * want.head_dim;
      return fmt::format("token {}, head {}, channel {}: expected 0x{:04x}, got 0x{:04x}", i / per_token,
                         i % per_token / want.head_dim, i % want.head_dim, want.data[i], got.data[i]);
    }
  }
  return {};
}

}  // namespace

void add_verify(CLI::App& app) {
  auto* cmd = app.add_subcommand("verify", "Round-trip a KV dump through a .gaac image in memory; exit 0 only if bit-exact");
  auto input = std::make_shared<std::string>();
  auto calib = std::make_shared<std::string>();
  cmd->add_option("input", *input, "KV dump (.safetensors)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--calib", *calib, "Calibration table (default: calibrate on the input itself)")
      ->check(CLI::ExistingFile);
  cmd->callback([input, calib] {
    const KvDump dump = load_dump(*input);
    const CalibrationTable table = calibration_for(dump, *input, *calib);
    std::vector<uint8_t> image;
    {
      const Activity activity("compressing " + *input + " in memory");
      ProgressBar bar("compressing");
      image = snapshot_image(dump, table, std::ref(bar));
    }
    Snapshot restored;
    {
      const Activity activity("restoring " + *input + " in memory");
      ProgressBar bar("restoring");
      restored = parse_snapshot(image, *input + " (in memory)", std::ref(bar));
    }
    if (restored.dump.layers.size() != dump.layers.size()) {
      throw CommandFailed(*input + ": verify FAILED: layer count differs");
    }
    for (size_t l = 0; l < dump.layers.size(); ++l) {
      for (const bool is_k : {true, false}) {
        const std::string diff = first_difference(is_k ? dump.layers[l].k : dump.layers[l].v,
                                                  is_k ? restored.dump.layers[l].k : restored.dump.layers[l].v);
        if (!diff.empty()) {
          throw CommandFailed(fmt::format("{}: verify FAILED at layer {} {}: {}", *input, l, is_k ? "K" : "V", diff));
        }
      }
    }
    if (restored.dump.metadata != dump.metadata) throw CommandFailed(*input + ": verify FAILED: metadata differs");
    fmt::print("verify OK: {} layers, {} elements bit-exact through {} of .gaac ({:.3f}x)\n", dump.layers.size(),
               dump.bf16_bytes() / 2, human_bytes(static_cast<double>(image.size())),
               static_cast<double>(dump.bf16_bytes()) / static_cast<double>(image.size()));
  });
}

}  // namespace gaac::cli
