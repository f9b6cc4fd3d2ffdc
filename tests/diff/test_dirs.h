// Fresh per-test directories under the test temp dir, and shared synthetic sets.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "synth_trace.h"

namespace gradtrace::testing {

// This process's scratch root; removed when the process exits (each test
// binary run is its own process under ctest). The pid keeps concurrent runs
// (other checkouts, ctest -j) apart.
inline std::filesystem::path ScratchRoot() {
  // Leaked on purpose: the atexit handler runs after static destructors.
  static const auto* root = [] {
    auto* p = new std::filesystem::path(std::filesystem::path(::testing::TempDir()) /
                                        ("gradtrace_diff." + std::to_string(getpid())));
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(ScratchRoot(), ec);
    });
    return p;
  }();
  return *root;
}

inline std::string FreshDir(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path p = ScratchRoot() / (std::string(info->test_suite_name()) + "." + info->name()) / name;
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p.parent_path());
  return p.string();
}

// Writes `spec` to a fresh directory `name` and returns its path (fails the test on error).
inline std::string Synth(const std::string& name, const SynthSpec& spec) {
  std::string dir = FreshDir(name);
  Status st = WriteSynthSet(dir, spec);
  EXPECT_TRUE(st.ok()) << st.message();
  return dir;
}

inline SynthSpec Reference() { return SynthSpec{}; }  // world 1, mean, local-mean: FINAL = g

inline SynthSpec Config(int dp, int sp, int zero, const std::string& scaling, const std::string& loss) {
  SynthSpec s;
  s.dp = dp;
  s.sp = sp;
  s.zero_stage = zero;
  s.scaling = scaling;
  s.loss = loss;
  return s;
}

}  // namespace gradtrace::testing
