// The gaac subcommands. Each registers itself on the application; its callback runs the command
// and throws gaac::Error (reported by main) or CommandFailed on failure.
#pragma once

#include <CLI/CLI.hpp>
#include <stdexcept>
#include <string>

namespace gaac::cli {

/// A command ran but its result is negative (e.g. a round trip that is not bit-exact): exit 1
/// after the message, which the command has already printed.
struct CommandFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void add_synth(CLI::App& app);
void add_calibrate(CLI::App& app);
void add_stats(CLI::App& app);
void add_compress(CLI::App& app);
void add_decompress(CLI::App& app);
void add_verify(CLI::App& app);
void add_inspect(CLI::App& app);
void add_generate(CLI::App& app);
void add_capture(CLI::App& app);
void add_validate(CLI::App& app);
void add_study(CLI::App& app);
/// `gaac convert`: a BF16 KV dump to FP8 (E4M3 or E5M2), per-tensor scaled or not.
void add_convert(CLI::App& app);
/// `gaac plan`: how much a KV-cache budget holds (src/cache/capacity.cpp), with GAAC and with BF16.
void add_capacity(CLI::App& app);

}  // namespace gaac::cli
