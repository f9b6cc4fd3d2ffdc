// --markdown: a report to paste into a GitHub issue (GFM tables, <details>).
#include <algorithm>

#include "compare/step_table.h"
#include "report/report.h"
#include "report/rows.h"
#include "slice_codec.h"
#include "text_escape.h"

namespace gradtrace::diff {
namespace {

constexpr size_t kOpenRows = 50;            // longer tables go under <details>
constexpr size_t kMarkdownNameBytes = 160;  // longer names are cut (ShortName); the JSON report has them whole

// Every string from a trace, a partial report or a path goes out through one of these (text_escape.h):
// regression, issue 20: producer, scaling, group names and summaries went out as raw HTML, a carriage return in
// a parameter name ended its table row, and a backtick closed its code span.
std::string Md(const std::string& s) { return MarkdownText(s); }
std::string Code(const std::string& s) { return MarkdownCode(s, MarkdownPlace::kTableCell); }

void ConfigRows(std::string& out, const Report& r) {
  bool two = r.mode != "self";
  auto row = [&](const std::string& label, auto get) {
    out += "| " + label + " | " + Md(get(r.a.config)) + (two ? " | " + Md(get(r.b.config)) : "") + " |\n";
  };
  out += two ? "| | A (reference) | B |\n|---|---|---|\n" : "| | trace |\n|---|---|\n";
  out += "| trace | " + Code(r.a.dir) + (two ? " | " + Code(r.b.dir) : "") + " |\n";
  out += "| producer | " + Md(r.a.producer) + (two ? " | " + Md(r.b.producer) : "") + " |\n";
  row("world (dp x sp)", [](const pb::Config& c) {
    return std::to_string(c.world()) + " (" + std::to_string(c.dp()) + " x " + std::to_string(c.sp()) + ")";
  });
  row("ZeRO stage", [](const pb::Config& c) { return std::to_string(c.zero_stage()); });
  row("scaling", [](const pb::Config& c) { return c.scaling().empty() ? std::string("-") : c.scaling(); });
  row("loss", [](const pb::Config& c) { return c.loss().empty() ? std::string("-") : c.loss(); });
  row("gas", [](const pb::Config& c) { return std::to_string(c.gas()); });
  row("dtype", [](const pb::Config& c) { return std::string(DTypeName(c.dtype())); });
  row("capture", [](const pb::Config& c) { return c.capture_mode().empty() ? std::string("full") : c.capture_mode(); });
}

}  // namespace

std::string RenderMarkdown(const Report& r, size_t top) {
  const ShownRows shown = RowsForPeople(r, top, kTextRows);
  std::string out;
  bool self = r.mode == "self";
  out += "### gradtrace-diff: " + Md(r.verdict) + "\n\n";
  if (!r.summary.empty()) out += "**" + Md(r.summary) + "**\n\n";
  ConfigRows(out, r);
  out +=
      "\nStep " + std::to_string(r.step) + ", phase " + MarkdownCode(r.phase) + "; " + Md(r.tolerance.bound) + ".\n\n";
  if (!r.steps.empty()) out += "Every step both sets recorded:\n\n" + RenderStepRowsMarkdown(r.steps) + "\n";
  if (!r.groups.empty()) {
    out += "| parameters | " + std::string(self ? "divisor" : "B/A") + " | explanation |\n|---:|---:|---|\n";
    for (const auto& g : r.groups) {
      out += "| " + std::to_string(g.count) + " | " + (g.scale ? FormatNumber(*g.scale, 5) : Md(g.kind)) + " | " +
             Md(g.explanation) + " |\n";
    }
    out += "\n";
  }
  const size_t rows = self ? r.self_params.size() : r.params.size();
  const bool folded = shown.index.size() > kOpenRows;
  if (folded) {
    out +=
        "<details><summary>" +
        (shown.hidden == 0 ? "All " + Thousands(rows) + " parameters"
                           : "The " + Thousands(shown.index.size()) + " worst of " + Thousands(rows) + " parameters") +
        "</summary>\n\n";
  }
  if (self) {
    out += "| verdict | parameter | numel | group | size | divisor | expected | residual |\n";
    out += "|---|---|---:|---|---:|---:|---:|---:|\n";
    for (size_t i : shown.index) {
      const SelfParam& p = r.self_params[i];
      out += std::string("| ") + SelfVerdictName(p.verdict) + " | " + Code(ShortName(p.name, kMarkdownNameBytes)) +
             " | " + std::to_string(p.numel) + " | " + Md(p.group) + " | " + std::to_string(p.group_size) + " | " +
             FormatNumber(p.divisor, 5) + " | " + FormatNumber(p.expected, 5) + " | " + FormatNumber(p.residual, 3) +
             " |\n";
    }
  } else {
    out += "| verdict | parameter | numel | scale | residual | cosine | rel. error | max abs error |\n";
    out += "|---|---|---:|---:|---:|---:|---:|---:|\n";
    for (size_t i : shown.index) {
      const ParamResult& p = r.params[i];
      const Metrics& m = p.metrics;
      bool none = m.basis == Basis::kNone;
      auto num = [&](double v, int d) { return none ? std::string("-") : FormatNumber(v, d); };
      out += std::string("| ") + VerdictName(p.verdict) + " | " + Code(ShortName(p.name, kMarkdownNameBytes)) + " | " +
             std::to_string(p.numel) + " | " + num(m.scale, 6) + " | " + num(m.residual, 3) + " | " + num(m.cosine, 6) +
             " | " + num(m.rel_error, 3) + " | " + MaxAbsErrorText(m) + " |\n";
    }
  }
  if (shown.hidden > 0) out += "\n" + shown.rest + " (the JSON report, `--json`, lists every parameter).\n";
  if (folded) out += "\n</details>\n";
  if (!r.findings.empty()) {
    out += "\n**Findings**\n\n";
    for (const auto& f : r.findings) out += "- **" + Md(f.kind) + "**: " + Md(f.message) + "\n";
  }
  out += "\n<sub>gradtrace-diff, exit code " + std::to_string(r.ExitCode()) + "</sub>\n";
  return out;
}

}  // namespace gradtrace::diff
