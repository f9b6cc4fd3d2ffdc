// The values a configuration pair predicts a scale factor B/A may equal, from
// the one degree list (degrees.h): "sp(B)" = 4, "1/dp(A)", "gas(B)/gas(A)".
// The two-set rules (factor_finding.h) match a measured factor against them.
#pragma once

#include <string>
#include <vector>

#include "dimension.h"
#include "gradtrace.pb.h"

namespace gradtrace::semantics {

struct Candidate {
  std::string expr;  // "sp(B)", "1/dp(A)", "gas(B)/gas(A)", "1"
  double value = 0;
  Dimension kind = Dimension::kOne;  // kOne or a degree (degrees.h)
  bool reciprocal = false;
  char side = 'B';       // whose config the atom comes from ('A', 'B', or 'R' for a B/A ratio)
  int complexity = 0;    // lower is preferred: 0 one, 1 atom, 2 reciprocal, 3 ratio or square
  bool squared = false;  // "1/gas(B)^2": a division by gas applied twice too often (DeepSpeed #7749)
};

// Every candidate of the two configs: atoms of each (values > 1), their
// reciprocals, and B/A ratios of the same quantity, simplest first.
std::vector<Candidate> ScaleCandidates(const pb::Config& a, const pb::Config& b);

// The candidates equal to `value` within relative `ctol`, best first.
std::vector<Candidate> MatchFactor(double value, const std::vector<Candidate>& candidates, double ctol);

// `x` equals `want` within relative `ctol` (and is finite).
bool NearFactor(double x, double want, double ctol);

}  // namespace gradtrace::semantics
