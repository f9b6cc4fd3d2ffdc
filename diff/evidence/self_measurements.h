// What --self and the live guard (python/gradtrace/guard) measure of one step: the sums of its
// reductions, the replicas that disagree, the norms, the non-finite values. --self measures from a
// trace set (self_check.cc); the guard in the training process, at a sketch's positions, and hands
// them over through the binding (_gtcodec.RunJudge). explain/self_judge.h judges them.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace gradtrace::diff {

// One parameter's reductions over one group in a step: the sums of S (the sum of PRE over the
// group's members) against P (a member's POST) at every element compared, P ~ S/d giving d = <S,S>/<S,P>.
struct ReductionSums {
  double ss = 0, sp = 0, pp = 0;
  int64_t compared = 0;
  // Model-parallel reductions (semantics::ModelParallelReduction): ||S||^2 and n x the sum of the
  // members' ||PRE||^2 over its reductions; they are equal (Cauchy-Schwarz) only when every member's
  // input was the same values, identical copies rather than partial sums.
  double sum_sq = 0, members_sq = 0;
  std::set<int32_t> buckets;
  std::string group;
  int group_size = 0;
  double declared = 0;                // the divisor the producer declared, 0 when none
  std::vector<std::string> problems;  // why part of it could not be measured (a member without PRE)
  void Merge(const ReductionSums& o);
};

// By (parameter id, group): a parameter reduced over two groups in one step (a norm summed over tp,
// then averaged over dp) has two reductions with divisors of their own.
using ReductionSumsByParam = std::map<std::pair<int32_t, std::string>, ReductionSums>;

// Whether the members of a reduction put in identical copies of one gradient, not partial sums:
// ||S||^2 = n x the sum of the n members' ||PRE||^2 within rtol^2 (Cauchy-Schwarz: equal only when
// every member holds the same values).
bool IdenticalInputs(double sum_sq, double members_sq, double rtol);

// Replicas of one parameter's FINAL (ranks holding the same elements) that disagree: the worst pair.
struct ReplicaDisagreement {
  double rel = 0;
  int rank = -1, other = -1;
};

// Non-finite values met in one record: its rank, phase, micro-step, bucket, group and parameters.
struct NonfiniteRecord {
  int rank = 0;
  std::string phase;  // PRE_REDUCE, POST_REDUCE or FINAL
  int32_t micro = 0, bucket = 0;
  std::string group;
  std::vector<int32_t> params;
};

// What one step measured.
struct SelfMeasurements {
  ReductionSumsByParam reductions;
  std::set<int32_t> accumulating;                   // parameters whose bucket accumulates across micro-steps
  std::map<int32_t, ReplicaDisagreement> replicas;  // parameters whose replicas disagree beyond rtol
  std::optional<double> reported_norm;              // what the framework reported for the step
  std::optional<double> final_norm;                 // the norm of the FINAL gradients, when every one was read
  std::vector<NonfiniteRecord> nonfinite;
  std::vector<int> skipped;  // ranks whose optimizer did not step in this step while others did
  // (kind, message) said after the parameters' findings: the set's inferences, its scope, its truncated files
  std::vector<std::pair<std::string, std::string>> notes;
  bool final_only = false;  // only FINAL was recorded: no divisor is measured
  bool truncated = false;   // a file of the set ended early
};

}  // namespace gradtrace::diff
