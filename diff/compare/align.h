// Alignment of two trace sets: parameters by (renamed) name with shapes
// checked, and the step both sides are compared at.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gradtrace.pb.h"
#include "load/rename.h"
#include "load/trace_set.h"
#include "status.h"

namespace gradtrace::diff {

struct ParamPair {
  std::string name;  // after renaming (A's original name when they differ, see name_a/name_b)
  std::string name_a, name_b;
  int32_t id_a = -1, id_b = -1;  // -1: absent on that side
  int64_t numel = 0;
  std::vector<int64_t> shape;
  pb::DType dtype_a = pb::DTYPE_UNSPECIFIED, dtype_b = pb::DTYPE_UNSPECIFIED;
  std::string problem;  // non-empty: cannot be compared (shape differs, absent)
};

struct Alignment {
  std::vector<ParamPair> params;  // A's table order, then B-only parameters
  int64_t step = 0;
  pb::Phase phase = pb::FINAL;
  std::vector<std::string> notes;
};

// Steps present in `set` for `phase` (any rank), ascending.
std::vector<int64_t> StepsWithPhase(const TraceSet& set, pb::Phase phase);

// Pairs parameters of `a` and `b` by name after `rules` (both sides). The
// step is `step` if given (InvalidArgument naming the set lacking it), else
// the first step both sides recorded for `phase` -- the one step where both
// runs still hold identical weights. InvalidArgument when no parameter name is
// shared (suggesting --rename) or the sets share no step.
Expected<Alignment> AlignSets(const TraceSet& a, const TraceSet& b, const std::vector<RenameRule>& rules,
                              pb::Phase phase, std::optional<int64_t> step);

std::string ShapeString(const std::vector<int64_t>& shape);
const char* PhaseName(pb::Phase phase);  // "final", "post", "pre"

}  // namespace gradtrace::diff
