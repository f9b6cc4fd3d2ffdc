// gradtrace-diff's analysis, callable without the command line: load, align,
// gather on all cores, judge, group and explain. Tests and the #5248 matrix
// call these directly and assert on the Report.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gradtrace.pb.h"
#include "report.h"
#include "status.h"
#include "trace_set.h"

namespace gradtrace::diff {

struct DiffOptions {
  pb::Phase phase = pb::FINAL;       // --phase final|post|pre
  std::optional<int64_t> step;       // --step N (default: first common step)
  std::optional<double> rtol;        // --rtol X
  std::string noise_dir;             // --noise A2: a second reference run
  std::vector<std::string> renames;  // --rename 'REGEX=REPL', in order
  int threads = 0;                   // 0 = all cores
  bool progress = false;             // allow a progress bar (still only on a TTY for large input)
  // Work unit: parameters read together, at most this many elements (or one parameter).
  int64_t unit_elements = int64_t{1} << 22;
};

// Compares trace set B against A. Errors (bad input) carry one line naming
// the file or directory; differences are not errors but the Report's verdict.
Expected<Report> RunDiff(const std::string& a_dir, const std::string& b_dir, const DiffOptions& options);

// The same on sets already loaded (noise: a second reference set, or null).
Expected<Report> DiffSets(const TraceSet& a, const TraceSet& b, const DiffOptions& options,
                          const TraceSet* noise = nullptr);

}  // namespace gradtrace::diff
