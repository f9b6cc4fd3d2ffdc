// Explanations: parameters grouped by scale factor, each factor matched against
// expressions of the two configurations and put into words.
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
  std::string kind;  // "one", "sp", "dp", "world", "gas", "experts", "ep", "predivide"
  bool reciprocal = false;
  char side = 'B';     // whose config the atom comes from ('A', 'B', or 'R' for a B/A ratio)
  int complexity = 0;  // lower is preferred: 0 one, 1 atom, 2 reciprocal, 3 ratio
};

// Every candidate of the two configs: atoms of each (values > 1), their
// reciprocals, and B/A ratios of the same quantity, simplest first.
std::vector<Candidate> ScaleCandidates(const pb::Config& a, const pb::Config& b);

// The candidates equal to `value` within relative `ctol`, best first.
std::vector<Candidate> MatchFactor(double value, const std::vector<Candidate>& candidates, double ctol);

// The multiple of the mean-loss gradient that configuration `c`'s FINAL
// gradient is, from its loss recipe (the ranks' local gradients sum to world x g
// for local-mean, dp x g for local-mean-div-sp / token-weighted / full-sequence)
// and its scaling policy's divisor (mean: world, ds-4530: dp, sum: 1,
// ds-pre-4957: world x sp). Empty when either is unknown.
std::optional<double> PredictedMultiple(const pb::Config& c);

// Loss recipes whose SP ranks' gradients add up to the gradient of the
// sequence's loss (so a reduction over dp x sp ranks must divide by dp only).
// local-mean and alst-tutorial add up to sp times it; unknown recipes: false.
bool SpRanksSumToSequenceLoss(const std::string& loss);

// Relative width within which scale factors count as one group.
double ClusterTolerance(double rtol);

// Groups `params` (already judged): "scale" groups for match/scaled clustered by
// factor, then one group each for mismatch, missing and nonfinite. Largest first.
std::vector<Group> GroupParams(const std::vector<ParamResult>& params, const pb::Config& a, const pb::Config& b,
                               double rtol);

// One sentence: "B/A = 2.000 = sp(B) for all 14 parameters: <why>".
std::string ExplainScale(double scale, int count, int total, const pb::Config& a, const pb::Config& b, double ctol,
                         std::string* expression);

}  // namespace gradtrace::diff
