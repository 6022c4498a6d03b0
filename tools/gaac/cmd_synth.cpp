// gaac synth: writes a seeded synthetic KV dump (Gaussian KV with per-channel scales).
#include <fmt/core.h>
#include <unistd.h>

#include "activity.hpp"
#include "commands.hpp"
#include "common.hpp"
#include "gaac/error.hpp"
#include "gaac/synthetic.hpp"
#include "io/kv_dump_file.hpp"
#include "io/output_file.hpp"
#include "numbers.hpp"

namespace gaac::cli {
namespace {

/// Physical memory of the machine in bytes (0 when unknown).
double physical_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
}

/// Refuses a dump the machine cannot hold: it is generated in memory and copied once more while
/// being written, so it needs twice its size.
void check_size(const SyntheticKvSpec& spec) {
  const double bytes = 2.0 * 2.0 * spec.layers * spec.kv_heads * spec.head_dim * static_cast<double>(spec.tokens);
  const double memory = physical_memory();
  if (memory > 0 && 2 * bytes > memory) {
    throw Error(fmt::format("--layers {} × --kv-heads {} × --head-dim {} × --tokens {} is {} of BF16 KV, which needs {} "
                            "of memory to generate and write; this machine has {}",
                            spec.layers, spec.kv_heads, spec.head_dim, spec.tokens, human_bytes(bytes),
                            human_bytes(2 * bytes), human_bytes(memory)));
  }
}

}  // namespace

void add_synth(CLI::App& app) {
  auto* cmd = app.add_subcommand("synth", "Write a synthetic KV dump (seeded, Gaussian with per-channel scales)");
  auto spec = std::make_shared<SyntheticKvSpec>();
  auto output = std::make_shared<std::string>();
  cmd->add_option("-o,--output", *output, "Output KV dump (.safetensors)")->required();
  cmd->add_option("--layers", spec->layers, "Layers")->capture_default_str()->transform(number_in(1, 1000));
  cmd->add_option("--kv-heads", spec->kv_heads, "KV heads per layer")->capture_default_str()->transform(number_in(1, 256));
  cmd->add_option("--head-dim", spec->head_dim, "Head width: 64, 128 or 256")
      ->capture_default_str()
      ->transform(number_of<int>({64, 128, 256}));
  cmd->add_option("--tokens", spec->tokens, "Tokens per layer")->capture_default_str()->transform(number_in(0, 1 << 24));
  cmd->add_option("--seed", spec->seed, "Random seed")
      ->capture_default_str()
      ->transform(number_in<uint64_t>(0, UINT64_MAX));
  cmd->callback([spec, output] {
    check_size(*spec);
    io::check_output(*output);  // before the work: a bad output fails at once
    KvDump dump;
    {
      const Activity activity(
          fmt::format("generating a synthetic KV dump of {} layers × {} tokens", spec->layers, spec->tokens));
      dump = make_synthetic_kv(*spec);
    }
    {
      const Activity activity("writing " + *output);
      io::save_kv_dump(dump, *output);
    }
    fmt::print("wrote {}: {} layers × {} tokens × {} KV heads × head_dim {} ({} of BF16 KV)\n", *output, spec->layers,
               spec->tokens, spec->kv_heads, spec->head_dim, human_bytes(static_cast<double>(dump.bf16_bytes())));
  });
}

}  // namespace gaac::cli
