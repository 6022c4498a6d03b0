#include "progress.hpp"

#include <unistd.h>

#include <cstdio>

namespace gaac::cli {

ProgressBar::ProgressBar(std::string label) : label_(std::move(label)), enabled_(::isatty(STDERR_FILENO) == 1) {}

ProgressBar::~ProgressBar() {
  if (drawn_) std::fprintf(stderr, "\r\033[K");
}

void ProgressBar::operator()(size_t done, size_t total) {
  if (!enabled_ || total == 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (done < total && drawn_ && now - last_ < std::chrono::milliseconds(100)) return;  // redraw at most 10×/s
  last_ = now;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(static_cast<double>(done) / static_cast<double>(total) * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, '.');
  std::fprintf(stderr, "\r%s [%s] %zu/%zu", label_.c_str(), bar.c_str(), done, total);
  std::fflush(stderr);
  drawn_ = true;
}

}  // namespace gaac::cli
