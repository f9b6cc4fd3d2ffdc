// The parallel degrees a configuration records, read once: THE list the
// diff's candidate factors, --self's divisor words and the predictions use.
#pragma once

#include <vector>

#include "dimension.h"
#include "gradtrace.pb.h"

namespace gradtrace::semantics {

// Degrees of a Config; a degree of 0 (not recorded) reads as 1.
struct Degrees {
  int dp = 1, sp = 1, cp = 1, tp = 1, pp = 1, ep = 1, edp = 1, gas = 1, world = 1;
  int replicate = 1;                     // HSDP: dp = replicate x shard (format 1.3)
  int split() const { return sp * cp; }  // ranks one sequence is split over
};
Degrees DegreesOf(const pb::Config& c);

// One named quantity of a configuration a scale factor may equal.
struct Degree {
  Dimension dim;  // sp, cp, dp, tp, replicate, world, gas, pp_microbatches, predivide, ep, edp, experts
  double (*get)(const pb::Config&);
};
// In order of preference when several equal a factor.
const std::vector<Degree>& ConfigDegrees();
// Position of `dim` in that order (kOne first, any other last).
int DegreeRank(Dimension dim);

}  // namespace gradtrace::semantics
