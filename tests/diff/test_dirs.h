// Fresh per-test directories under the test temp dir, and shared synthetic sets.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>

#include "synth_big.h"
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

// Two sets of one big fp32 parameter (synth_big.h) in fresh directories `name`-a and `name`-b, B = 2 x A:
// `numel` elements in chunks cut mid-slice across frames, `dp` replicas per side.
inline std::pair<std::string, std::string> BigParamPair(const std::string& name, int64_t numel, int dp) {
  BigParamSpec spec;
  spec.numel = numel;
  spec.dp = dp;
  std::pair<std::string, std::string> dirs{FreshDir(name + "-a"), FreshDir(name + "-b")};
  EXPECT_TRUE(WriteBigParamSet(dirs.first, spec).ok());
  spec.factor = 2;
  spec.run_id = "big-param-x2";
  EXPECT_TRUE(WriteBigParamSet(dirs.second, spec).ok());
  return dirs;
}

}  // namespace gradtrace::testing
