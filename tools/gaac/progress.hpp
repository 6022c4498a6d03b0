// A one-line progress bar on stderr, drawn only when stderr is a terminal.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace gaac::cli {

/// Draws "label [#####.....] done/total" on stderr as a gaac::Progress callback; clears the line on
/// destruction. Does nothing when stderr is not a terminal, so pipes and logs stay clean.
class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  /// Reports progress (usable wherever a gaac::Progress is expected via std::ref).
  void operator()(size_t done, size_t total);

 private:
  std::string label_;
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace gaac::cli
