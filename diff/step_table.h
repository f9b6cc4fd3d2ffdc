// --step all: one comparison per step both sets recorded, and a table with a
// row per step. Sets are loaded (catalogued) once; each step reads only its
// own frames.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "diff_engine.h"
#include "report.h"
#include "status.h"

namespace gradtrace::diff {

struct StepTable {
  std::vector<Report> steps;      // ascending step
  std::string verdict = "match";  // the most severe of the steps' verdicts
  std::string summary;            // one line: how many steps differ, from which step on

  int ExitCode() const { return verdict == "match" ? 0 : 1; }
  // The first step whose report is not a match (null when all match).
  const Report* FirstDifference() const;
  // The step --html draws: the first difference, else the last step.
  const Report& Shown() const;
};

// Compares B against A at every step both recorded for options.phase
// (options.step is ignored). InvalidArgument when they share no step.
// Progress ("step i/N") on stderr when options.progress. options.bucket_view:
// the sides' bucket views of the Shown() step only (one full --self pass per
// side, not one per step).
Expected<StepTable> DiffAllSteps(const TraceSet& a, const TraceSet& b, const DiffOptions& options,
                                 const TraceSet* noise = nullptr);
Expected<StepTable> RunDiffAllSteps(const std::string& a_dir, const std::string& b_dir, const DiffOptions& options);

// Renderers: a row per step (verdict, parameter counts, largest residual,
// summary), then the first differing step's full report (text, Markdown).
// JSON: {"schema_version", "tool", "mode": "steps", "verdict", "exit_code",
// "summary", "phase", "steps": [the --json report of each step]}.
std::string RenderStepTableText(const StepTable& t, bool colour, size_t max_rows);
std::string RenderStepTableJson(const StepTable& t);
std::string RenderStepTableMarkdown(const StepTable& t);

}  // namespace gradtrace::diff
