// gaac: lossless compression of BF16 KV caches (GAAC). Results go to stdout, diagnostics to stderr.
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <new>
#include <optional>
#include <system_error>

#include "activity.hpp"
#include "commands.hpp"
#include "gaac/error.hpp"
#include "gaac/gaac.h"
#include "io/temporary_files.hpp"
#include "standard_output.hpp"
#include "terminal_text.hpp"

namespace {

/// The first word of the command line that should name a (sub)command but names none, with the
/// commands it could have named; CLI11 would report it only as "A subcommand is required".
std::optional<std::string> unknown_command(const CLI::App& app, int argc, char** argv) {
  const CLI::App* current = &app;
  std::string path = "gaac";
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    const auto commands = current->get_subcommands([](const CLI::App*) { return true; });
    if (commands.empty() || word.empty() || word[0] == '-') return std::nullopt;  // options are CLI11's to check
    const CLI::App* found = nullptr;
    std::string names;
    for (const CLI::App* c : commands) {
      if (c->check_name(word)) found = c;
      names += (names.empty() ? "" : ", ") + c->get_name();
    }
    if (found == nullptr) {
      return fmt::format("'{}' is not a {} command (commands: {}); see {} --help", gaac::cli::printable(word), path,
                         names, path);
    }
    current = found;
    path += " " + found->get_name();
  }
  return std::nullopt;
}

/// What the command was doing when it failed, for messages that carry none ("" when unknown).
std::string while_doing() {
  const std::string& step = gaac::cli::Activity::failed_activity();
  return step.empty() ? std::string() : " while " + gaac::cli::printable(step);
}

/// Prints a diagnostic; text from files or the command line is shown escaped.
void report(const std::string& prefix, const std::string& message) {
  fmt::print(stderr, "gaac: {}{}\n", prefix, gaac::cli::printable(message));
}

}  // namespace

int main(int argc, char** argv) {
  gaac::io::remove_temporaries_on_signals();
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
  gaac::cli::add_convert(app);
  gaac::cli::add_capacity(app);
  if (const auto unknown = unknown_command(app, argc, argv)) {
    fmt::print(stderr, "gaac: {}\n", *unknown);
    return static_cast<int>(CLI::ExitCodes::ExtrasError);
  }
  int status = 0;
  try {
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      status = app.exit(e);  // usage errors, and --help / --version (which print to stdout)
    }
    gaac::cli::finish_stdout();
  } catch (const gaac::cli::CommandFailed& e) {
    report("", e.what());
    return 1;
  } catch (const gaac::Error& e) {
    report("error: ", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    const std::string where = while_doing();
    report("error: ", "ran out of memory" + (where.empty() ? " (the input may be too large for this machine)" : where));
    return 1;
  } catch (const std::system_error& e) {
    // fmt reports a failed write to stdout this way.
    if (std::ferror(stdout)) {
      report("error: ", std::string("cannot write the results to standard output: ") + e.code().message());
    } else {
      report("error", while_doing() + ": " + e.what());
    }
    return 1;
  } catch (const std::exception& e) {
    report("unexpected error", while_doing() + ": " + e.what());
    return 1;
  }
  return status;
}
