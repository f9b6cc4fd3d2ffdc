// A RunInfo from the package's JSON (proto JSON): what the writer and the judge binding parse.
#pragma once

#include <string>

#include "gradtrace.pb.h"

namespace gradtrace {

// ValueError (pybind11) on JSON that is not a RunInfo; unknown keys are errors, not silent defaults.
pb::RunInfo RunInfoFromJson(const std::string& json);

}  // namespace gradtrace
