// gaac synth: writes a seeded synthetic KV dump (Gaussian KV with per-channel scales).
#include <fmt/core.h>

#include "commands.hpp"
#include "common.hpp"
#include "gaac/synthetic.hpp"

namespace gaac::cli {

void add_synth(CLI::App& app) {
  auto* cmd = app.add_subcommand("synth", "Write a synthetic KV dump (seeded, Gaussian with per-channel scales)");
  auto spec = std::make_shared<SyntheticKvSpec>();
  auto output = std::make_shared<std::string>();
  cmd->add_option("-o,--output", *output, "Output KV dump (.safetensors)")->required();
  cmd->add_option("--layers", spec->layers, "Layers")->capture_default_str()->check(CLI::Range(1, 1000));
  cmd->add_option("--kv-heads", spec->kv_heads, "KV heads per layer")->capture_default_str()->check(CLI::Range(1, 256));
  cmd->add_option("--head-dim", spec->head_dim, "Head width: 64, 128 or 256")
      ->capture_default_str()
      ->check(CLI::IsMember({64, 128, 256}));
  cmd->add_option("--tokens", spec->tokens, "Tokens per layer")->capture_default_str()->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--seed", spec->seed, "Random seed")->capture_default_str();
  cmd->callback([spec, output] {
    const KvDump dump = make_synthetic_kv(*spec);
    save_kv_dump(dump, *output);
    fmt::print("wrote {}: {} layers × {} tokens × {} KV heads × head_dim {} ({} of BF16 KV)\n", *output, spec->layers,
               spec->tokens, spec->kv_heads, spec->head_dim, human_bytes(static_cast<double>(dump.bf16_bytes())));
  });
}

}  // namespace gaac::cli
