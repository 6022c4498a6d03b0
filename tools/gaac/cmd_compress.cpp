// gaac compress / decompress: KV dump <-> .gaac snapshot.
#include <fmt/core.h>

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

}  // namespace

void add_compress(CLI::App& app) {
  auto* cmd = app.add_subcommand("compress", "Compress a KV dump into a lossless .gaac snapshot");
  auto input = std::make_shared<std::string>();
  auto calib = std::make_shared<std::string>();
  auto output = std::make_shared<std::string>();
  cmd->add_option("input", *input, "KV dump (.safetensors)")->required()->check(CLI::ExistingFile);
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
    const KvDump dump = load_dump(*input);
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
    fmt::print("{}: {} BF16 -> {} ({:.3f}x), wrote {}\n", *input, human_bytes(static_cast<double>(dump.bf16_bytes())),
               human_bytes(static_cast<double>(image.size())),
               static_cast<double>(dump.bf16_bytes()) / static_cast<double>(image.size()), *output);
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
    Snapshot snapshot;
    {
      const Activity activity("reading the snapshot " + *input);
      ProgressBar bar("decompressing");
      snapshot = read_snapshot(*input, std::ref(bar));
    }
    {
      const Activity activity("writing " + *output);
      io::save_kv_dump(snapshot.dump, *output, inputs);
    }
    fmt::print("{}: {} layers, {} of BF16 KV, wrote {}\n", *input, snapshot.dump.layers.size(),
               human_bytes(static_cast<double>(snapshot.dump.bf16_bytes())), *output);
  });
}

}  // namespace gaac::cli
