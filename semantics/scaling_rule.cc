#include "scaling_rule.h"

namespace gradtrace::semantics {

double RuleDivisor(ScalingRule rule, int group_size, int sp) {
  switch (rule) {
    case ScalingRule::kSum:
      return 1;
    case ScalingRule::kMean:
      return group_size;
    case ScalingRule::kDs4530:
    case ScalingRule::kDsPre4957:
      return static_cast<double>(group_size) / (sp > 0 ? sp : 1);
  }
  return 1;
}

}  // namespace gradtrace::semantics
