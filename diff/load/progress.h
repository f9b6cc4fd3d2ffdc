// A progress bar on stderr, for inputs large enough to wait on. Thread-safe;
// redraws at most ~10 times a second; silent unless enabled.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace gradtrace::diff {

class Progress {
 public:
  Progress(std::string label, bool enabled) : label_(std::move(label)), enabled_(enabled) {}
  ~Progress() { Finish(); }
  void Update(uint64_t done, uint64_t total);
  void Finish();  // clears the line; idempotent

  // Bars are for people: only when stderr is a terminal and the input is at
  // least `threshold_bytes`.
  static bool Wanted(uint64_t input_bytes, uint64_t threshold_bytes = 64ull << 20);

 private:
  std::string label_;
  bool enabled_;
  bool drawn_ = false;
  std::mutex mu_;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace gradtrace::diff
