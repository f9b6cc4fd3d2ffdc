#include "step_table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "align.h"
#include "evidence.h"
#include "json_io.h"
#include "progress.h"

namespace gradtrace::diff {
namespace {

// Most severe first; "match" is the least.
int VerdictRank(const std::string& v) {
  for (int i = 0; const char* name : {"nonfinite", "mismatch", "missing", "incomplete", "scaled"}) {
    if (v == name) return 5 - i;
    ++i;
  }
  return 0;
}

struct Counts {
  int match = 0, differ = 0;
  double worst_residual = 0;
};

Counts CountParams(const Report& r) {
  Counts c;
  for (const ParamResult& p : r.params) {
    (p.verdict == Verdict::kMatch ? c.match : c.differ) += 1;
    if (std::isfinite(p.metrics.residual)) c.worst_residual = std::max(c.worst_residual, p.metrics.residual);
  }
  return c;
}

std::string Row(const Report& r, const char* sep, bool markdown) {
  const Counts c = CountParams(r);
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s%6lld%s%-11s%s%6d%s%6d%s%10s%s", markdown ? "| " : "",
                static_cast<long long>(r.step), sep, r.verdict.c_str(), sep, c.match, sep, c.differ, sep,
                FormatNumber(c.worst_residual, 3).c_str(), sep);
  std::string summary = r.summary;
  if (markdown) {
    for (char& ch : summary) ch = ch == '|' ? '/' : ch;
    return buf + summary + " |\n";
  }
  return buf + summary + "\n";
}

}  // namespace

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

Expected<StepTable> RunDiffAllSteps(const std::string& a_dir, const std::string& b_dir, const DiffOptions& options) {
  auto sets = LoadSets(a_dir, b_dir, options);
  if (!sets.ok()) return sets.status();
  return DiffAllSteps(sets->a, sets->b, options, sets->noise ? &*sets->noise : nullptr);
}

std::string RenderStepTableText(const StepTable& t, bool colour, size_t max_rows) {
  std::string out = "  step  verdict      match differ  residual  summary\n";
  for (const Report& r : t.steps) out += Row(r, "  ", false);
  out += "\nVerdict over " + std::to_string(t.steps.size()) + " steps: " + t.verdict + " -- " + t.summary + "\n";
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
  j["mode"] = "steps";
  j["verdict"] = t.verdict;
  j["exit_code"] = t.ExitCode();
  j["summary"] = t.summary;
  j["phase"] = t.steps.empty() ? "final" : t.steps.front().phase;
  j["steps"] = Json::array();
  for (const Report& r : t.steps) j["steps"].push_back(ReportToJson(r));
  return DumpJson(j);
}

std::string RenderStepTableMarkdown(const StepTable& t) {
  std::string out = "### gradtrace-diff, every step: " + t.verdict + "\n\n" + t.summary + "\n\n";
  out += "| step | verdict | match | differ | largest residual | summary |\n|---:|---|---:|---:|---:|---|\n";
  for (const Report& r : t.steps) out += Row(r, " | ", true);
  if (const Report* first = t.FirstDifference()) {
    out += "\n#### Step " + std::to_string(first->step) + ", the first that differs\n\n" + RenderMarkdown(*first);
  }
  return out;
}

}  // namespace gradtrace::diff
