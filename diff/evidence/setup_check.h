// Setup mistakes that are not gradient bugs: two runs that start from
// different weights (another init seed) or see different data. Format 1.4
// records what tells them apart (FORMAT.md 4.1): each parameter's values when
// capture began at a few fixed elements (ParamInfo.init_sketch), and the
// moments of the inputs each rank saw per optimizer step (StepInfo input_*).
// Either difference makes every later gradient differ, so the diff reports it
// as its own verdict instead of a scale or a mismatch.
#pragma once

#include <string>
#include <vector>

#include "compare/align.h"
#include "load/trace_set.h"

namespace gradtrace::diff {

struct SetupDifference {
  std::string verdict;  // "" (none found), "different-start" or "different-data"
  std::string summary;  // one sentence
  int params_differ = 0;
  int params_checked = 0;        // parameters both sides sketched
  int64_t first_data_step = -1;  // the first step whose inputs differ, -1 when none
  int64_t data_steps_checked = 0;
};

// Initial weights of the aligned parameters, and the inputs of every step
// both sets recorded moments for. Nothing recorded (before 1.4, or a shard
// only) is nothing found.
SetupDifference CheckSetup(const TraceSet& a, const TraceSet& b, const Alignment& al);

}  // namespace gradtrace::diff
