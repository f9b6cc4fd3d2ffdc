// The judging function of --self, bound for the live guard (judge_binding.cc).
#pragma once

#include <pybind11/pybind11.h>

namespace gradtrace {

void RegisterJudge(pybind11::module_& m);

}  // namespace gradtrace
