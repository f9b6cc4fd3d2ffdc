// What the live guard calls a violation in a judged step, and the line it says for one: the one reading of a
// self report (explain/self_judge.h) and of a comparison with a reference run for the Python guard
// (python/gradtrace/guard, through _gtcodec.RunJudge) and gradtrace-train's (capture/train/guard_sink.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "report/report.h"

namespace gradtrace::diff {

struct Violation {
  std::string check;                // "divisor", "replicas", "non-finite", "skipped-step", "grad-norm", "reference"
  std::string cause;                // the group's cause (semantics::CauseName), "" for findings
  std::string message;              // the diff's words: the group's explanation or the finding's message
  std::vector<std::string> params;  // the group's parameters (none for findings)
  std::vector<int32_t> buckets;     // the buckets they were reduced in, sorted
  std::optional<double> divisor;    // the group's effective divisor
};

// A self report's violations: each divisor group holding a parameter judged wrong-divisor or inconsistent, then
// each replica, non-finite, skipped-step and grad-norm finding.
std::vector<Violation> SelfViolations(const Report& self);

// A comparison with a reference run (a diff report, the reference as A): each group whose parameters do not all
// match, as check "reference".
std::vector<Violation> ReferenceViolations(const Report& against);

// "gradtrace guard: rank R: step S: bucket 3 (12 parameters): <message>", terminal-safe.
std::string ViolationLine(int rank, int64_t step, const Violation& v);

}  // namespace gradtrace::diff
