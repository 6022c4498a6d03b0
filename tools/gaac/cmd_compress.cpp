// gaac compress / decompress: KV dump <-> .gaac snapshot.
#include <fmt/core.h>

#include <filesystem>

#include "commands.hpp"
#include "common.hpp"
#include "gaac/snapshot.hpp"
#include "progress.hpp"

namespace gaac::cli {

void add_compress(CLI::App& app) {
  auto* cmd = app.add_subcommand("compress", "Compress a KV dump into a lossless .gaac snapshot");
  auto input = std::make_shared<std::string>();
  auto calib = std::make_shared<std::string>();
  auto output = std::make_shared<std::string>();
  cmd->add_option("input", *input, "KV dump (.safetensors)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--calib", *calib, "Calibration table (default: calibrate on the input itself)")
      ->check(CLI::ExistingFile);
  cmd->add_option("-o,--output", *output, "Snapshot to write (.gaac)")->required();
  cmd->callback([input, calib, output] {
    const KvDump dump = load_dump(*input);
    const CalibrationTable table = calibration_for(dump, *calib);
    {
      ProgressBar bar("compressing");
      write_snapshot(dump, table, *output, std::ref(bar));
    }
    const auto written = std::filesystem::file_size(*output);
    fmt::print("{}: {} BF16 -> {} ({:.3f}x), wrote {}\n", *input, human_bytes(static_cast<double>(dump.bf16_bytes())),
               human_bytes(static_cast<double>(written)),
               static_cast<double>(dump.bf16_bytes()) / static_cast<double>(written), *output);
  });
}

void add_decompress(CLI::App& app) {
  auto* cmd = app.add_subcommand("decompress", "Restore the KV dump stored in a .gaac snapshot, bit for bit");
  auto input = std::make_shared<std::string>();
  auto output = std::make_shared<std::string>();
  cmd->add_option("input", *input, "Snapshot (.gaac)")->required()->check(CLI::ExistingFile);
  cmd->add_option("-o,--output", *output, "KV dump to write (.safetensors)")->required();
  cmd->callback([input, output] {
    Snapshot snapshot;
    {
      ProgressBar bar("decompressing");
      snapshot = read_snapshot(*input, std::ref(bar));
    }
    save_kv_dump(snapshot.dump, *output);
    fmt::print("{}: {} layers, {} of BF16 KV, wrote {}\n", *input, snapshot.dump.layers.size(),
               human_bytes(static_cast<double>(snapshot.dump.bf16_bytes())), *output);
  });
}

}  // namespace gaac::cli
