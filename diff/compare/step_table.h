// --step all: one comparison per step both sets recorded, and a table with a
// row per step. Sets are loaded (catalogued) once; each step reads only its
// own frames.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compare/diff_engine.h"
#include "report/report.h"
#include "status.h"

namespace gradtrace::diff {

struct StepTable {
  std::vector<Report> steps;      // ascending step
  std::string verdict = "match";  // the most severe of the steps' verdicts
  std::string summary;            // one line: how many steps differ, from which step on

  int ExitCode() const { return ExitCodeOf(verdict); }
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

// The default diff (no --step): compares every step both sets recorded and
// returns the report of the first step that differs (else the first step),
// with Report.steps holding a row per step when there are several. With
// options.step it is DiffSets. options.bucket_view: of the reported step only.
Expected<Report> DiffSteps(const TraceSet& a, const TraceSet& b, const DiffOptions& options,
                           const TraceSet* noise = nullptr);
Expected<Report> RunDiffSteps(const std::string& a_dir, const std::string& b_dir, const DiffOptions& options);
// The report of the first step of `table` that differs (else its first step), with Report.steps a row
// per step and a note saying what was compared ("every step <what>") when there are several.
Report ReportOfSteps(StepTable table, const std::string& what);
// The rows of Report.steps, from the steps' reports.
StepRow RowOf(const Report& r);
// The step rows as a text table (the header and a line per step), or "" without rows.
std::string RenderStepRowsText(const std::vector<StepRow>& rows);
std::string RenderStepRowsMarkdown(const std::vector<StepRow>& rows);

// Renderers: a row per step (verdict, parameter counts, largest residual,
// summary), then the first differing step's full report (text, Markdown).
// JSON: {"schema_version", "tool", "mode": "steps", "verdict", "exit_code",
// "summary", "phase", "steps": [the --json report of each step]}.
std::string RenderStepTableText(const StepTable& t, bool colour, size_t max_rows);
std::string RenderStepTableJson(const StepTable& t);
std::string RenderStepTableMarkdown(const StepTable& t);

}  // namespace gradtrace::diff
