// One judging function for --self and the live guard: what one step measured
// (evidence/self_measurements.h) goes in, the judged Report comes out, in the words of explain/.
// Nothing here reads a file or knows LibTorch: the guard reaches it through the binding
// (_gtcodec.RunJudge).
#pragma once

#include <optional>

#include "evidence/self_measurements.h"
#include "gradtrace.pb.h"
#include "report/report.h"

namespace gradtrace::diff {

// A report's side from a rank's RunInfo and the world size (producer, run id, config, framework; no dir).
TraceSide SideOfRun(const pb::RunInfo& run, int world);

// A self report's head: mode self, phase post, side A from `run` (rank 0's RunInfo) and `world`, and
// the tolerance (`rtol`, else the dtypes' default, tolerance.h).
Report SelfReportHead(const pb::RunInfo& run, int world, std::optional<double> rtol);

// The head of a self report: mode, phase, tolerance (before its absolute floor) and step are the
// caller's; report->bucket_view and report->findings may hold the measuring's already. Judges
// every parameter (SelfParam, its verdict against semantics::ExpectedDivisorOver), groups them by
// divisor in explain/'s words, marks disagreeing replicas, adds the non-finite values, the skipped
// steps, the notes, the accumulation and grad-norm findings, and sets the verdict and summary.
void JudgeSelf(const pb::RunInfo& run, const SelfMeasurements& m, Report* report);

}  // namespace gradtrace::diff
