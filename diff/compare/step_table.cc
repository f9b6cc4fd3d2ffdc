#include "compare/step_table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "compare/align.h"
#include "evidence/evidence.h"
#include "load/progress.h"
#include "report/json_io.h"
#include "text_escape.h"

namespace gradtrace::diff {
namespace {

// Most severe first; "match" is the least.
int VerdictRank(const std::string& v) {
  // A setup difference explains the gradient verdicts it comes with: it ranks first.
  for (int i = 0; const char* name :
                  {"different-start", "different-data", "nonfinite", "mismatch", "missing", "incomplete", "scaled"}) {
    if (v == name) return 7 - i;
    ++i;
  }
  return 0;
}

// The summary quotes names from the traces: escaped for the output (text_escape.h).
std::string Row(const StepRow& r, const char* sep, bool markdown) {
  const auto esc = markdown ? MarkdownText : TerminalSafe;
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s%6lld%s%-11s%s%6d%s%6d%s%10s%s", markdown ? "| " : "",
                static_cast<long long>(r.step), sep, esc(r.verdict).c_str(), sep, r.match, sep, r.differ, sep,
                FormatNumber(r.worst_residual, 3).c_str(), sep);
  return buf + esc(r.summary) + (markdown ? " |\n" : "\n");
}

constexpr char kTextHeader[] = "  step  verdict      match differ  residual  summary\n";
constexpr char kMarkdownHeader[] =
    "| step | verdict | match | differ | largest residual | summary |\n|---:|---|---:|---:|---:|---|\n";

}  // namespace

StepRow RowOf(const Report& r) {
  StepRow row;
  row.step = r.step;
  row.verdict = r.verdict;
  row.summary = r.summary;
  for (const ParamResult& p : r.params) {
    (p.verdict == Verdict::kMatch ? row.match : row.differ) += 1;
    if (std::isfinite(p.metrics.residual)) row.worst_residual = std::max(row.worst_residual, p.metrics.residual);
  }
  for (const SelfParam& p : r.self_params) {  // self mode: ok or not
    (p.verdict == SelfVerdict::kOk ? row.match : row.differ) += 1;
    if (std::isfinite(p.residual)) row.worst_residual = std::max(row.worst_residual, p.residual);
  }
  return row;
}

std::string RenderStepRowsText(const std::vector<StepRow>& rows) {
  if (rows.empty()) return "";
  std::string out = kTextHeader;
  for (const StepRow& r : rows) out += Row(r, "  ", false);
  return out;
}

std::string RenderStepRowsMarkdown(const std::vector<StepRow>& rows) {
  if (rows.empty()) return "";
  std::string out = kMarkdownHeader;
  for (const StepRow& r : rows) out += Row(r, " | ", true);
  return out;
}

const Report* StepTable::FirstDifference() const {
  for (const Report& r : steps) {
    if (r.ExitCode() != 0) return &r;
  }
  return nullptr;
}

const Report& StepTable::Shown() const {
  const Report* first = FirstDifference();
  return first != nullptr ? *first : steps.back();
}

Expected<StepTable> DiffAllSteps(const TraceSet& a, const TraceSet& b, const DiffOptions& options,
                                 const TraceSet* noise) {
  std::vector<int64_t> sa = StepsWithPhase(a, options.phase), sb = StepsWithPhase(b, options.phase), common;
  std::set_intersection(sa.begin(), sa.end(), sb.begin(), sb.end(), std::back_inserter(common));
  if (common.empty()) {
    return Status::InvalidArgument(b.dir() + ": shares no " + PhaseName(options.phase) + " step with " + a.dir());
  }
  StepTable t;
  Progress progress("gradtrace-diff: steps",
                    options.progress && common.size() > 1 && Progress::Wanted(a.total_bytes() + b.total_bytes()));
  for (size_t i = 0; i < common.size(); ++i) {
    DiffOptions o = options;
    o.step = common[i];
    o.progress = false;  // one progress line for the whole table
    o.bucket_view = false;
    auto r = DiffSets(a, b, o, noise);
    if (!r.ok()) return r.status();
    if (VerdictRank(r->verdict) > VerdictRank(t.verdict)) t.verdict = r->verdict;
    t.steps.push_back(std::move(*r));
    progress.Update(i + 1, common.size());
  }
  progress.Finish();
  if (options.bucket_view) {
    Report& shown = const_cast<Report&>(t.Shown());  // an element of t.steps, which this function owns
    shown.a.bucket_view = SideBucketView(a, shown.step, options.rtol, options.threads);
    shown.b.bucket_view = SideBucketView(b, shown.step, options.rtol, options.threads);
  }
  const Report* first = t.FirstDifference();
  const auto differ = std::count_if(t.steps.begin(), t.steps.end(), [](const Report& r) { return r.ExitCode() != 0; });
  t.summary = first == nullptr
                  ? "all " + std::to_string(t.steps.size()) + " steps match"
                  : std::to_string(differ) + " of " + std::to_string(t.steps.size()) +
                        " steps differ, the first at step " + std::to_string(first->step) + ": " + first->summary;
  return t;
}

Report ReportOfSteps(StepTable table, const std::string& what) {
  std::vector<Report>& steps = table.steps;
  const auto first = std::find_if(steps.begin(), steps.end(), [](const Report& s) { return s.ExitCode() != 0; });
  std::vector<StepRow> rows;
  for (const Report& s : steps) rows.push_back(RowOf(s));
  Report r = std::move(first != steps.end() ? *first : steps.front());
  if (rows.size() > 1) {
    const auto differ = std::count_if(steps.begin(), steps.end(), [](const Report& s) { return s.ExitCode() != 0; });
    const std::string which = first == steps.end() ? "none differs"
                                                   : std::to_string(differ) + " differ; this report is step " +
                                                         std::to_string(r.step) + ", the first that differs";
    r.findings.push_back({"note", "compared every step " + what + " (" + std::to_string(rows.size()) + "): " + which +
                                      " (--step N compares one step)"});
    r.steps = std::move(rows);
  }
  return r;
}

Expected<Report> DiffSteps(const TraceSet& a, const TraceSet& b, const DiffOptions& options, const TraceSet* noise) {
  if (options.step) return DiffSets(a, b, options, noise);
  DiffOptions each = options;
  each.bucket_view = false;
  auto table = DiffAllSteps(a, b, each, noise);
  if (!table.ok()) return table.status();
  Report r = ReportOfSteps(std::move(*table), "both sets recorded");
  if (options.bucket_view) {
    r.a.bucket_view = SideBucketView(a, r.step, options.rtol, options.threads);
    r.b.bucket_view = SideBucketView(b, r.step, options.rtol, options.threads);
  }
  return r;
}

Expected<Report> RunDiffSteps(const std::string& a_dir, const std::string& b_dir, const DiffOptions& options) {
  auto sets = LoadSets(a_dir, b_dir, options);
  if (!sets.ok()) return sets.status();
  return DiffSteps(sets->a, sets->b, options, sets->noise ? &*sets->noise : nullptr);
}

Expected<StepTable> RunDiffAllSteps(const std::string& a_dir, const std::string& b_dir, const DiffOptions& options) {
  auto sets = LoadSets(a_dir, b_dir, options);
  if (!sets.ok()) return sets.status();
  return DiffAllSteps(sets->a, sets->b, options, sets->noise ? &*sets->noise : nullptr);
}

std::string RenderStepTableText(const StepTable& t, bool colour, size_t max_rows) {
  std::string out = kTextHeader;
  for (const Report& r : t.steps) out += Row(RowOf(r), "  ", false);
  out += "\nVerdict over " + std::to_string(t.steps.size()) + " steps: " + TerminalSafe(t.verdict) + " -- " +
         TerminalSafe(t.summary) + "\n";
  if (const Report* first = t.FirstDifference()) {
    out += "\n== step " + std::to_string(first->step) + ", the first that differs\n";
    out += RenderText(*first, colour, max_rows);
  }
  return out;
}

std::string RenderStepTableJson(const StepTable& t) {
  Json j = Json::object();
  j["schema_version"] = kReportSchemaVersion;
  j["tool"] = "gradtrace-diff";
  j["mode"] = !t.steps.empty() && t.steps.front().mode == "self" ? "self-steps" : "steps";
  j["verdict"] = t.verdict;
  j["exit_code"] = t.ExitCode();
  j["summary"] = t.summary;
  j["phase"] = t.steps.empty() ? "final" : t.steps.front().phase;
  j["steps"] = Json::array();
  for (const Report& r : t.steps) j["steps"].push_back(ReportToJson(r));
  return DumpJson(j);
}

std::string RenderStepTableMarkdown(const StepTable& t) {
  std::string out =
      "### gradtrace-diff, every step: " + MarkdownText(t.verdict) + "\n\n" + MarkdownText(t.summary) + "\n\n";
  out += kMarkdownHeader;
  for (const Report& r : t.steps) out += Row(RowOf(r), " | ", true);
  if (const Report* first = t.FirstDifference()) {
    out += "\n#### Step " + std::to_string(first->step) + ", the first that differs\n\n" + RenderMarkdown(*first);
  }
  return out;
}

}  // namespace gradtrace::diff
