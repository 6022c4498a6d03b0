// gaac: lossless compression of BF16 KV caches (GAAC). Results go to stdout, diagnostics to stderr.
#include <fmt/core.h>

#include <CLI/CLI.hpp>

#include "commands.hpp"
#include "gaac/error.hpp"
#include "gaac/gaac.h"

int main(int argc, char** argv) {
  CLI::App app{"gaac: lossless compression of BF16 LLM KV caches (Group-Adaptive Additive Codec)"};
  app.set_version_flag("--version", std::string(GAAC_VERSION_STRING));
  app.require_subcommand(1);
  gaac::cli::add_synth(app);
  gaac::cli::add_calibrate(app);
  gaac::cli::add_stats(app);
  gaac::cli::add_compress(app);
  gaac::cli::add_decompress(app);
  gaac::cli::add_verify(app);
  gaac::cli::add_inspect(app);
  gaac::cli::add_generate(app);
  gaac::cli::add_capture(app);
  gaac::cli::add_validate(app);
  gaac::cli::add_study(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const gaac::cli::CommandFailed& e) {
    fmt::print(stderr, "gaac: {}\n", e.what());
    return 1;
  } catch (const gaac::Error& e) {
    fmt::print(stderr, "gaac: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "gaac: unexpected error: {}\n", e.what());
    return 1;
  }
  return 0;
}
