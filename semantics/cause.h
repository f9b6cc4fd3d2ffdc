// What makes a scale factor or a divisor: THE list of causes a finding names.
// The rules that pick one are factor_finding.h (two trace sets) and
// divisor_finding.h (--self); diff/ only puts a finding into words. The names
// are the report's JSON `cause` values (diff/REPORT_SCHEMA.md, groups[]): a
// stable contract, never renamed.
#pragma once

namespace gradtrace::semantics {

enum class Cause {
  kNone,                     // nothing: B matches A, or the divisor is what the layout needs
  kLossMultiplier,           // the loss passed to backward over-counts a dimension (a local mean per shard, no / gas)
  kReductionDivisor,         // the reduction divides by the wrong amount
  kDoubleDivision,           // a division applied twice (MoE buckets before DeepSpeed PR #4957, gas^2 in #7749)
  kPredivide,                // the gradient_predivide_factor, divided or multiplied once too often
  kLossyCompression,         // a lossy communication hook (PowerSGD): not a multiple at all
  kIncompleteGroup,          // the dense reduction group leaves out a split dimension
  kTokenNormalisation,       // a loss normalised per micro-batch or shard, not by the total valid tokens
  kPipelineScheduleScaling,  // a pipeline schedule's scale_grads does not match how the loss reduces (x or /
                             // n_microbatches)
  kAmbiguous,                // several causes predict the factor and nothing in the traces rules all but one out
  kUnexplained,              // no rule fits
};

// "none", "loss-multiplier", "reduction-divisor", "double-division",
// "predivide", "lossy-compression", "incomplete-group", "token-normalisation",
// "pp-schedule-scaling", "ambiguous", "unexplained".
const char* CauseName(Cause cause);

}  // namespace gradtrace::semantics
