// What an effective divisor that --self measured means: the rules that match a
// reduction's divisor d (the sum of PRE_REDUCE over its group / POST_REDUCE)
// against the expressions of its recorded layout (group size, dp, the split,
// replicate, gas, a division applied twice) and name a cause. diff/evidence/self_check.cc
// only puts a DivisorFinding into words.
#pragma once

#include <optional>
#include <string>

#include "cause.h"
#include "deepspeed_releases.h"
#include "dimension.h"
#include "gradtrace.pb.h"

namespace gradtrace::semantics {

// One measured divisor of parameters of one kind, reduced over one group.
struct MeasuredDivisor {
  double divisor = 0;      // effective divisor d
  std::string param_kind;  // "dense", "expert", ... "" unrecorded
  std::string group;       // the group's name
  int group_size = 0;
  double expected = 0;  // what the layout needs (ExpectedDivisorOver); 0 unknown
  // A model-parallel reduction (ModelParallelReduction), and whether its
  // members' inputs were identical copies rather than partial sums.
  bool model_parallel = false;
  bool identical_inputs = false;
};

// The rule a divisor matched, in the order they are tried; each reads as one
// sentence.
enum class DivisorRule {
  kUnmatched,            // no expression of the configuration
  kPartialSumsAdded,     // 1: a model-parallel group's partial sums, added as needed
  kPartialSumsAveraged,  // group size: those partial sums averaged instead
  kCopiesAdded,          // 1: identical copies added (no reduction was needed)
  kExpertsByDp,          // experts divided by the dense data-parallel degree, as needed
  kExpertsOverEdp,       // edp group size: experts averaged over their edp group (ep x too large)
  kGroupMean,            // group size
  kShardOnly,            // group size / replicate: HSDP's divide factor leaves out the replicas
  kDpOnlyOverSp,         // dp = group size / sp (DeepSpeed since PR #4530)
  kDpOnlyOverCp,         // dp = group size / cp
  kSum,                  // 1: no division
  kDividedTwice,         // (group size / sp)^2 or group size x sp: the bucket divided twice (PR #4957)
  kSpOnly,               // sp
  kAlsoGas,              // group size x gas
};

struct DivisorFinding {
  DivisorRule rule = DivisorRule::kUnmatched;
  Cause cause = Cause::kUnexplained;       // kNone when the divisor is what the layout needs
  std::string expression;                  // "dp", "group size / replicate", ...; "" for kUnmatched
  Dimension dimension = Dimension::kNone;  // the parallel dimension it follows
  bool right = false;                      // the divisor is the expected one
  double multiple = 1;                     // expected / divisor: FINAL as a multiple of the mean-loss gradient
  bool with_replicas = false;              // HSDP: the group's POST_REDUCE also sums over its replicas
  std::optional<DeepSpeedChange> change;   // the DeepSpeed change behind it; DeepSpeed runs only
};

// The finding for divisor `m` of a run with configuration `c`, divisors equal
// within relative `ctol`; `deepspeed`: its DeepSpeed history may be cited.
DivisorFinding ExplainDivisor(const MeasuredDivisor& m, const pb::Config& c, bool deepspeed, double ctol);

// The cause of reductions that are not a multiple of their inputs: lossy
// compression when the run communicates through a lossy hook, else none known.
Cause InconsistentReductionCause(const pb::Config& c);

// Whether a POST_REDUCE over `group` also holds the all-reduce over HSDP's
// replicas (Config.replicate > 1, FORMAT.md 4.1): every group but "replicate".
bool SumsOverReplicas(const pb::Config& c, const std::string& group);

}  // namespace gradtrace::semantics
