// Explanations: parameters grouped by scale factor, each factor explained by
// its cause (a loss multiplier, a reduction divisor, a double division...) in
// a parallel dimension and a parameter group. The arithmetic is semantics/'s
// (predict.h, expected_divisor.h); this file matches factors and puts them
// into words.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "gradtrace.pb.h"
#include "report.h"

namespace gradtrace::diff {

// A value the configurations predict for a scale factor, e.g. sp(B) = 4.
struct Candidate {
  std::string expr;  // "sp(B)", "1/dp(A)", "gas(B)/gas(A)", "1"
  double value = 0;
  std::string kind;  // "one" or a degree name (semantics/degrees.h)
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

// Relative width within which scale factors count as one group.
double ClusterTolerance(double rtol);

// The cause of a scale factor and its sentence (without the "B/A = ... for N
// parameters: " prefix). Fills a Group's cause, dimension, side, predicted, expression.
struct Cause {
  std::string expression;  // the candidate the factor equals ("" none)
  std::string cause;       // Group::cause
  std::string dimension;
  std::string side;
  std::optional<double> predicted;
  std::string why;  // words
};
Cause ExplainCause(double scale, const std::string& param_kind, const TraceSide& a, const TraceSide& b, double ctol);

// One sentence: "B/A = 2.000 = sp(B) for all 14 parameters: <why>".
std::string ExplainScale(double scale, int count, int total, const std::string& param_kind, const TraceSide& a,
                         const TraceSide& b, double ctol, Cause* cause);

// Groups `params` (already judged): "scale" groups for match/scaled clustered by
// factor, then one group each for mismatch, missing and nonfinite. Most serious first
// (GroupSeverity), then largest.
std::vector<Group> GroupParams(const std::vector<ParamResult>& params, const TraceSide& a, const TraceSide& b,
                               double rtol);

// Whether DeepSpeed's history may be cited for side `s`: its producer or
// framework is DeepSpeed, or its scaling policy models DeepSpeed arithmetic.
bool CitesDeepSpeed(const TraceSide& s);

}  // namespace gradtrace::diff
