// Runs a test body on N forked ranks that talk over Gloo on 127.0.0.1 with a
// shared FileStore, as c10d's own ProcessGroupGlooTest does. The parent never
// touches LibTorch (so fork is safe); each child reports through its exit
// code and prints its failures to stderr with a "[rank N]" prefix.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "process_groups.h"

namespace gradtrace::capture::testing {

// Body of one rank: returns "" on success, else a one-line failure.
using RankBody = std::function<std::string(const Groups& groups)>;

// Forks dp*sp ranks, builds their groups (10 s collective timeout) and runs
// `body` on each. Fails if any rank fails, crashes or exceeds `timeout_s`.
::testing::AssertionResult RunRanks(int dp, int sp, const RankBody& body, int timeout_s = 120);

// Relative error ||a - b|| / ||b|| (0 when both are zero; inf when only b is).
double RelErr(const at::Tensor& a, const at::Tensor& b);

}  // namespace gradtrace::capture::testing
