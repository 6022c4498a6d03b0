// gaac verify: compresses and restores a KV dump in memory; succeeds only if every bit survives.
#include <fmt/core.h>

#include <type_traits>
#include <variant>

#include "activity.hpp"
#include "commands.hpp"
#include "common.hpp"
#include "gaac/snapshot.hpp"
#include "progress.hpp"

namespace gaac::cli {
namespace {

/// Describes the first element where two tensors (BF16 or FP8) differ, or returns an empty string.
template <class T>
std::string first_difference(const BasicKvTensor<T>& want, const BasicKvTensor<T>& got) {
  if (want.tokens != got.tokens || want.kv_heads != got.kv_heads || want.head_dim != got.head_dim) return "shape differs";
  for (size_t i = 0; i < want.data.size(); ++i) {
    if (want.data[i] != got.data[i]) {
      const size_t per_token = static_cast<size_t>(want.kv_heads) * want.head_dim;
      return fmt::format("token {}, head {}, channel {}: expected 0x{:0{}x}, got 0x{:0{}x}", i / per_token,
                         i % per_token / want.head_dim, i % want.head_dim, want.data[i], 2 * sizeof(T), got.data[i], 2 * sizeof(T));
    }
  }
  return {};
}

/// Compresses and restores `dump` in memory; throws CommandFailed at the first difference.
template <class Dump>
void verify(const Dump& dump, const std::string& input, const std::string& calib) {
  const CalibrationTable table = calibration_for(dump, input, calib);
  std::vector<uint8_t> image;
  {
    const Activity activity("compressing " + input + " in memory");
    ProgressBar bar("compressing");
    image = snapshot_image(dump, table, std::ref(bar));
  }
  AnySnapshot any;
  {
    const Activity activity("restoring " + input + " in memory");
    ProgressBar bar("restoring");
    any = parse_any_snapshot(image, input + " (in memory)", std::ref(bar));
  }
  const auto* restored = std::get_if<std::conditional_t<std::is_same_v<Dump, KvDump>, Snapshot, Fp8Snapshot>>(&any);
  if (restored == nullptr) throw CommandFailed(input + ": verify FAILED: the snapshot has another element format");
  if (restored->dump.layers.size() != dump.layers.size()) throw CommandFailed(input + ": verify FAILED: layer count differs");
  for (size_t l = 0; l < dump.layers.size(); ++l) {
    for (const bool is_k : {true, false}) {
      const std::string diff = first_difference(is_k ? dump.layers[l].k : dump.layers[l].v,
                                                is_k ? restored->dump.layers[l].k : restored->dump.layers[l].v);
      if (!diff.empty()) throw CommandFailed(fmt::format("{}: verify FAILED at layer {} {}: {}", input, l, is_k ? "K" : "V", diff));
    }
  }
  if (restored->dump.metadata != dump.metadata) throw CommandFailed(input + ": verify FAILED: metadata differs");
  size_t elements = 0;
  for (const auto& layer : dump.layers) elements += layer.k.elements() + layer.v.elements();
  if constexpr (std::is_same_v<Dump, Fp8KvDump>) {
    if (restored->dump.k_scales != dump.k_scales || restored->dump.v_scales != dump.v_scales) {
      throw CommandFailed(input + ": verify FAILED: scales differ");
    }
  }
  const size_t bytes = elements * static_cast<size_t>(element_bytes(table.element_format()));
  fmt::print("verify OK: {} layers, {} {} elements bit-exact through {} of .gaac ({:.3f}x)\n", dump.layers.size(), elements,
             to_string(table.element_format()), human_bytes(static_cast<double>(image.size())),
             static_cast<double>(bytes) / static_cast<double>(image.size()));
}

}  // namespace

void add_verify(CLI::App& app) {
  auto* cmd = app.add_subcommand("verify", "Round-trip a KV dump through a .gaac image in memory; exit 0 only if bit-exact");
  auto input = std::make_shared<std::string>();
  auto calib = std::make_shared<std::string>();
  cmd->add_option("input", *input, "KV dump (.safetensors): BF16, or FP8 (F8_E4M3 / F8_E5M2)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--calib", *calib, "Calibration table (default: calibrate on the input itself)")
      ->check(CLI::ExistingFile);
  cmd->callback([input, calib] { std::visit([&](const auto& dump) { verify(dump, *input, *calib); }, load_any_dump(*input)); });
}

}  // namespace gaac::cli
