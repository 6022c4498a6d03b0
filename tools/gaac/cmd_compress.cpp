// gaac compress / decompress: KV dump <-> .gaac snapshot.
#include <fmt/core.h>

#include <type_traits>
#include <variant>

#include "activity.hpp"
#include "commands.hpp"
#include "common.hpp"
#include "gaac/error.hpp"
#include "gaac/snapshot.hpp"
#include "io/kv_dump_file.hpp"
#include "io/output_file.hpp"
#include "progress.hpp"

#if GAAC_CLI_CUDA
#include "gaac/cuda.hpp"
#endif

namespace gaac::cli {
namespace {

/// The snapshot image encoded on `device` ("cpu" or "cuda").
std::vector<uint8_t> encode_on(const std::string& device, const KvDump& dump, const CalibrationTable& table,
                               const Progress& progress) {
  if (device == "cpu") return snapshot_image(dump, table, progress);
#if GAAC_CLI_CUDA
  if (!cuda::device_available()) throw gaac::Error("compress --device cuda: no CUDA device found");
  return cuda::snapshot_image(dump, table, progress);
#else
  throw gaac::Error("compress --device cuda: this gaac was built without CUDA");
#endif
}

/// An FP8 dump's image (encoded on the CPU; the GPU snapshot encoder is BF16's).
std::vector<uint8_t> encode_on(const std::string& device, const Fp8KvDump& dump, const CalibrationTable& table,
                               const Progress& progress) {
  if (device != "cpu") throw gaac::Error("compress --device " + device + ": FP8 dumps are encoded on the CPU");
  return snapshot_image(dump, table, progress);
}

/// "BF16" or "E4M3"/"E5M2", and the dump's bytes in its own format.
std::string format_label(const KvDump&) { return "BF16"; }
std::string format_label(const Fp8KvDump& dump) { return dump.format == ElementFormat::e4m3 ? "E4M3" : "E5M2"; }
size_t own_bytes(const KvDump& dump) { return dump.bf16_bytes(); }
size_t own_bytes(const Fp8KvDump& dump) { return dump.fp8_bytes(); }

}  // namespace

void add_compress(CLI::App& app) {
  auto* cmd = app.add_subcommand("compress", "Compress a KV dump into a lossless .gaac snapshot");
  auto input = std::make_shared<std::string>();
  auto calib = std::make_shared<std::string>();
  auto output = std::make_shared<std::string>();
  cmd->add_option("input", *input, "KV dump (.safetensors): BF16, or FP8 (F8_E4M3 / F8_E5M2)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--calib", *calib, "Calibration table (default: calibrate on the input itself)")
      ->check(CLI::ExistingFile);
  cmd->add_option("-o,--output", *output, "Snapshot to write (.gaac)")->required();
  auto device = std::make_shared<std::string>("cpu");
  cmd->add_option("--device", *device, "Where the tiles are encoded: cpu, or cuda (the same bytes)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->callback([input, calib, output, device] {
    const std::vector<std::string> inputs{*input, *calib};
    io::check_output(*output, inputs);  // before the work: a bad output fails at once
    std::visit(
        [&](const auto& dump) {
          const CalibrationTable table = calibration_for(dump, *input, *calib);
          std::vector<uint8_t> image;
          {
            const Activity activity("compressing " + *input);
            ProgressBar bar("compressing");
            image = encode_on(*device, dump, table, std::ref(bar));
          }
          {
            const Activity activity("writing " + *output);
            const std::span<const uint8_t> parts[] = {image};
            io::write_output(*output, parts, inputs);
          }
          fmt::print("{}: {} {} -> {} ({:.3f}x), wrote {}\n", *input, human_bytes(static_cast<double>(own_bytes(dump))),
                     format_label(dump), human_bytes(static_cast<double>(image.size())),
                     static_cast<double>(own_bytes(dump)) / static_cast<double>(image.size()), *output);
        },
        load_any_dump(*input));
  });
}

void add_decompress(CLI::App& app) {
  auto* cmd = app.add_subcommand("decompress", "Restore the KV dump stored in a .gaac snapshot, bit for bit");
  auto input = std::make_shared<std::string>();
  auto output = std::make_shared<std::string>();
  cmd->add_option("input", *input, "Snapshot (.gaac)")->required()->check(CLI::ExistingFile);
  cmd->add_option("-o,--output", *output, "KV dump to write (.safetensors)")->required();
  cmd->callback([input, output] {
    const std::vector<std::string> inputs{*input};
    io::check_output(*output, inputs);  // before the work: a bad output fails at once
    AnySnapshot snapshot;
    {
      const Activity activity("reading the snapshot " + *input);
      ProgressBar bar("decompressing");
      snapshot = read_any_snapshot(*input, std::ref(bar));
    }
    std::visit(
        [&](const auto& s) {
          {
            const Activity activity("writing " + *output);
            if constexpr (std::is_same_v<std::decay_t<decltype(s)>, Fp8Snapshot>) {
              io::save_fp8_kv_dump(s.dump, *output, inputs);
            } else {
              io::save_kv_dump(s.dump, *output, inputs);
            }
          }
          fmt::print("{}: {} layers, {} of {} KV, wrote {}\n", *input, s.dump.layers.size(),
                     human_bytes(static_cast<double>(own_bytes(s.dump))), format_label(s.dump), *output);
        },
        snapshot);
  });
}

}  // namespace gaac::cli
