#include "load/progress.h"

#include <unistd.h>

#include <cstdio>

namespace gradtrace::diff {

bool Progress::Wanted(uint64_t input_bytes, uint64_t threshold_bytes) {
  return ::isatty(STDERR_FILENO) && input_bytes >= threshold_bytes;
}

void Progress::Update(uint64_t done, uint64_t total) {
  if (!enabled_ || total == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto now = std::chrono::steady_clock::now();
  if (drawn_ && done < total && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  constexpr int kWidth = 40;
  double frac = done >= total ? 1.0 : static_cast<double>(done) / static_cast<double>(total);
  int fill = static_cast<int>(frac * kWidth);
  std::string bar(fill, '#');
  bar.resize(kWidth, '.');
  std::fprintf(stderr, "\r%s [%s] %5.1f%%", label_.c_str(), bar.c_str(), frac * 100);
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::Finish() {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (drawn_) std::fprintf(stderr, "\r\033[K");
  drawn_ = false;
}

}  // namespace gradtrace::diff
