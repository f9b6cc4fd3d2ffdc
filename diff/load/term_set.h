// A loss term's part of a run's gradients (issue 48 item 2, gradtrace-diff A B --baseline C): C is the same run
// with the suspected term switched off (its coefficient 0), so SIDE minus C is the term's contribution. This
// writes that difference as a trace set of its own (FINAL records and StepInfo, loss minus C's loss), which the
// diff then compares like any other: a factor and a cause for the term's part alone.
#pragma once

#include <map>
#include <string>

#include "status.h"

namespace gradtrace::diff {

// Writes `side` minus `baseline` into the new directory `out`: per rank, every FINAL record of `side` minus the
// record of `baseline` with the same step, micro-step, bucket, chunk and slices, in the slice's dtype; StepInfo
// frames with the loss minus `baseline`'s. Both must be directories of full traces of one model and layout (same
// world, parameter table and FINAL records): InvalidArgument naming what differs otherwise.
// Returns, per parameter name, how much larger its FINAL is than its term's part (||side|| / ||side - baseline||,
// the largest over the steps; infinity when the part is zero): the term's part carries both runs' rounding, at
// the scale of the runs' gradients, so its tolerance grows by that factor (DiffOptions::rtol_scale).
Expected<std::map<std::string, double>> WriteTermSet(const std::string& side, const std::string& baseline,
                                                     const std::string& out);

}  // namespace gradtrace::diff
