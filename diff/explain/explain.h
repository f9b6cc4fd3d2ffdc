// Explanations: parameters grouped by scale factor, each factor explained by
// its cause (a loss multiplier, a reduction divisor, a double division...) in
// a parallel dimension and a parameter group. The rules and the arithmetic are
// semantics/'s (factor_finding.h computes a typed Finding from the two
// configurations and each side's reduction evidence); this file groups the
// parameters and puts each Finding into words, one sentence per reading.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "candidates.h"
#include "deepspeed_releases.h"
#include "gradtrace.pb.h"
#include "report/report.h"

namespace gradtrace::diff {

// A value the configurations predict for a scale factor, e.g. sp(B) = 4
// (semantics/candidates.h).
using semantics::Candidate;
using semantics::MatchFactor;
using semantics::ScaleCandidates;

// Relative width within which scale factors count as one group.
double ClusterTolerance(double rtol);

// The cause of a scale factor and its sentence (without the "B/A = ... for N
// parameters: " prefix). Fills a Group's cause, dimension, side, predicted, expression.
struct Cause {
  std::string expression;  // the candidate the factor equals ("" none)
  semantics::Cause cause = semantics::Cause::kUnexplained;
  semantics::Dimension dimension = semantics::Dimension::kNone;
  std::string side;
  std::optional<double> predicted;
  std::string why;                         // words
  std::vector<CandidateCause> candidates;  // Group::candidates
  std::string rerun;                       // Group::rerun
};
// `others_match`: other parameters of the comparison match (semantics::ExplainFactor).
Cause ExplainCause(double scale, const std::string& param_kind, const TraceSide& a, const TraceSide& b, double ctol,
                   bool others_match = false);

// One sentence: "B/A = 2.000 = sp(B) for all 14 parameters: <why>".
std::string ExplainScale(double scale, int count, int total, const std::string& param_kind, const TraceSide& a,
                         const TraceSide& b, double ctol, Cause* cause, bool others_match = false);

// Groups `params` (already judged): "scale" groups for match/scaled clustered by
// factor, then one group each for mismatch, missing and nonfinite. Most serious first
// (GroupSeverity), then largest.
std::vector<Group> GroupParams(const std::vector<ParamResult>& params, const TraceSide& a, const TraceSide& b,
                               double rtol);

// Whether DeepSpeed's history may be cited for side `s`: its producer or
// framework is DeepSpeed, or its scaling policy models DeepSpeed arithmetic.
bool CitesDeepSpeed(const TraceSide& s);

// Why the copies of a tied parameter (ParamInfo.stages names two pipeline
// stages, format 1.5) disagree, as a clause to append to a replica finding;
// "" for any other parameter.
std::string TiedCopiesWords(const pb::ParamInfo& param);

// Sentences are templates: `text` with each {name} replaced by words.at(name),
// in one pass, so words from a trace are never read as placeholders; an
// unknown {name} stays as it is.
std::string FillSentence(const char* text, const std::map<std::string, std::string>& words);

// The words citing a DeepSpeed change: `text` with {ref}, {first} and {broken}
// from its row of the change table (semantics/deepspeed_releases.h); "" when
// there is no change or no text.
std::string CiteChange(const char* text, const std::optional<semantics::DeepSpeedChange>& change);

}  // namespace gradtrace::diff
