#include "cause.h"

namespace gradtrace::semantics {

const char* CauseName(Cause cause) {
  switch (cause) {
    case Cause::kNone:
      return "none";
    case Cause::kLossMultiplier:
      return "loss-multiplier";
    case Cause::kReductionDivisor:
      return "reduction-divisor";
    case Cause::kDoubleDivision:
      return "double-division";
    case Cause::kPredivide:
      return "predivide";
    case Cause::kLossyCompression:
      return "lossy-compression";
    case Cause::kIncompleteGroup:
      return "incomplete-group";
    case Cause::kTokenNormalisation:
      return "token-normalisation";
    case Cause::kPipelineScheduleScaling:
      return "pp-schedule-scaling";
    case Cause::kAmbiguous:
      return "ambiguous";
    case Cause::kUnexplained:
      return "unexplained";
  }
  return "unexplained";
}

}  // namespace gradtrace::semantics
