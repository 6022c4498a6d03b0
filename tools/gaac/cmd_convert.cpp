// gaac convert: a BF16 KV dump to an FP8 one, as serving engines write FP8 caches (docs/format.md,
// section 14.8): vLLM's saturating round-to-nearest conversion of each value divided by its tensor's scale.
#include <fmt/core.h>

#include <map>

#include "activity.hpp"
#include "commands.hpp"
#include "common.hpp"
#include "gaac/fp8_dump.hpp"
#include "io/kv_dump_file.hpp"
#include "io/output_file.hpp"

namespace gaac::cli {

void add_convert(CLI::App& app) {
  auto* cmd = app.add_subcommand("convert", "Convert a BF16 KV dump to FP8 (E4M3 or E5M2) as serving engines store it");
  auto input = std::make_shared<std::string>();
  auto output = std::make_shared<std::string>();
  auto format = std::make_shared<ElementFormat>(ElementFormat::e4m3);
  auto scaling = std::make_shared<Fp8Scaling>(Fp8Scaling::per_tensor);
  cmd->add_option("input", *input, "BF16 KV dump (.safetensors)")->required()->check(CLI::ExistingFile);
  cmd->add_option("-o,--output", *output, "FP8 KV dump to write (.safetensors)")->required();
  cmd->add_option("--to", *format, "FP8 format: e4m3 (E4M3FN, max 448) or e5m2 (max 57344)")
      ->required()
      ->transform(CLI::CheckedTransformer(std::map<std::string, ElementFormat>{{"e4m3", ElementFormat::e4m3}, {"e5m2", ElementFormat::e5m2}}));
  cmd->add_option("--scale", *scaling, "per-tensor: each K and V tensor of a layer divided by amax / the largest FP8 value; none: scale 1")
      ->capture_default_str()
      ->transform(CLI::CheckedTransformer(std::map<std::string, Fp8Scaling>{{"per-tensor", Fp8Scaling::per_tensor}, {"none", Fp8Scaling::none}}));
  cmd->footer(
      "Each value becomes the FP8 value nearest to float(value) / scale (ties to even), magnitudes beyond the largest\n"
      "finite FP8 value saturated to it (CUDA's __nv_cvt_float_to_fp8 with __NV_SATFINITE, vLLM's FP8 cache write).\n"
      "The scales are stored as k_scale and v_scale (F32 [layers]).");
  cmd->callback([input, output, format, scaling] {
    io::check_output(*output, {input.get(), 1});  // before the work: a bad output fails at once
    const KvDump dump = load_dump(*input);
    Fp8KvDump fp8;
    {
      const Activity activity("converting " + *input + " to " + to_string(*format));
      fp8 = convert_to_fp8(dump, *format, *scaling);
    }
    {
      const Activity activity("writing " + *output);
      io::save_fp8_kv_dump(fp8, *output, {input.get(), 1});
    }
    fmt::print("{}: {} of BF16 -> {} of {} ({} scales), wrote {}\n", *input, human_bytes(static_cast<double>(dump.bf16_bytes())),
               human_bytes(static_cast<double>(fp8.fp8_bytes())), to_string(*format), to_string(*scaling), *output);
  });
}

}  // namespace gaac::cli
