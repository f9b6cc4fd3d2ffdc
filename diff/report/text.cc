// The terminal table: worst parameters first, colour only on a terminal.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "compare/metrics.h"
#include "compare/step_table.h"
#include "report/report.h"
#include "report/rows.h"
#include "slice_codec.h"
#include "text_escape.h"

namespace gradtrace::diff {

std::string FormatNumber(double v, int digits) {
  if (std::isnan(v)) return "-";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.*g", digits, v);
  return buf;
}

std::string MaxAbsErrorText(const Metrics& m) {
  if (m.basis == Basis::kNone) return "-";
  if (m.nonfinite_a + m.nonfinite_b > 0) return "NaN";
  return FormatNumber(m.max_abs_error, 3);
}

std::string FormatFixed(double v) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.3f", v);
  return buf;
}

std::string ConfigSummary(const pb::Config& c) {
  // A degree of 0 is "not recorded" (FORMAT.md 4.1) and reads as 1; the others show only when > 1.
  std::string s = "world " + std::to_string(c.world()) + " (dp " + std::to_string(std::max(1, c.dp())) + " x sp " +
                  std::to_string(std::max(1, c.sp()));
  for (auto [name, degree] : {std::pair{"cp", c.cp()}, {"tp", c.tp()}, {"pp", c.pp()}, {"replicate", c.replicate()}}) {
    if (degree > 1) s += std::string(", ") + name + " " + std::to_string(degree);
  }
  s += "), ZeRO-" + std::to_string(c.zero_stage());
  if (!c.scaling().empty()) s += ", scaling " + c.scaling();
  if (!c.loss().empty()) s += ", loss " + c.loss();
  if (c.gas() > 1) s += ", gas " + std::to_string(c.gas());
  if (c.pp_microbatches() > 0) {  // format 1.5: the pipeline schedule
    s += ", pipeline " + (c.pp_schedule().empty() ? std::string("schedule") : c.pp_schedule()) + " x " +
         std::to_string(c.pp_microbatches()) + " micro-batches";
    if (c.has_pp_scale_grads()) s += c.pp_scale_grads() ? " (scale_grads)" : " (scale_grads=False)";
  }
  if (c.moe_experts() > 0)
    s += ", experts " + std::to_string(c.moe_experts()) + " (ep " + std::to_string(c.ep_size()) + ")";
  if (c.gradient_predivide_factor() != 0 && c.gradient_predivide_factor() != 1) {
    s += ", predivide " + FormatNumber(c.gradient_predivide_factor());
  }
  if (c.dtype() != pb::DTYPE_UNSPECIFIED) s += std::string(", ") + DTypeName(c.dtype());
  if (!c.capture_mode().empty() && c.capture_mode() != "full") s += ", capture " + c.capture_mode();
  return s;
}

std::string Headline(const Report& r) {
  if (r.mode == "self") return "self-check of " + r.a.dir + ": " + r.verdict;
  return "B (" + r.b.dir + ") against A (" + r.a.dir + "): " + r.verdict;
}

namespace {

const char* Colour(const std::string& verdict) {
  if (verdict == "match" || verdict == "ok") return "\033[32m";
  if (verdict == "scaled" || verdict == "incomplete" || verdict == "wrong-divisor") return "\033[33m";
  if (verdict == "missing") return "\033[35m";
  return "\033[31m";
}

std::string Paint(const std::string& text, const std::string& verdict, bool colour, int width) {
  std::string padded = text;
  if (static_cast<int>(padded.size()) < width) padded.resize(width, ' ');
  if (!colour) return padded;
  return std::string(Colour(verdict)) + padded + "\033[0m";
}

// A right-aligned cell always keeps a space before its text, so a value wider
// than its column (a negative scale, "-1.23457e-05") never runs into the last.
std::string Cell(const std::string& s, int width, bool left = false) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), left ? "%-*s" : "%*s", width, s.c_str());
  std::string out = buf;
  if (!left && static_cast<int>(s.size()) >= width) out.insert(0, " ");
  return out;
}

// Every string from a trace, a partial report or a path goes out through T: regression, issue 20 (a name
// holding "\x1b[2J" cleared the terminal).
std::string T(const std::string& s) { return TerminalSafe(s); }

std::string Clip(const std::string& s, size_t width) {
  if (s.size() <= width) return s;
  return "..." + s.substr(s.size() - (width - 3));
}

}  // namespace

std::string RenderText(const Report& r, bool colour, size_t top) {
  const ShownRows shown = RowsForPeople(r, top, kTextRows);
  std::string out;
  const char* bold = colour ? "\033[1m" : "";
  const char* reset = colour ? "\033[0m" : "";
  if (r.mode == "self") {
    out += std::string(bold) + "gradtrace-diff --self " + T(r.a.dir) + reset + "\n";
    out += "  " + T(r.a.producer) + ", " + T(ConfigSummary(r.a.config)) + "\n";
    out += "  step " + std::to_string(r.step) + ", POST_REDUCE against the sum of PRE_REDUCE over each group; " +
           T(r.tolerance.bound) + "\n\n";
    size_t nw = 9;
    for (size_t i : shown.index) nw = std::max(nw, std::min<size_t>(T(r.self_params[i].name).size(), 48));
    out += std::string(bold) + Cell("VERDICT", 14, true) + Cell("PARAMETER", nw + 2, true) + Cell("NUMEL", 10) +
           Cell("GROUP", 8) + Cell("SIZE", 6) + Cell("DIVISOR", 10) + Cell("EXPECTED", 10) + Cell("DECLARED", 10) +
           Cell("RESIDUAL", 11) + reset + "\n";
    for (size_t i : shown.index) {
      const auto& p = r.self_params[i];
      out += Paint(SelfVerdictName(p.verdict), SelfVerdictName(p.verdict), colour, 14) +
             Cell(Clip(T(p.name), 48), nw + 2, true) + Cell(std::to_string(p.numel), 10) + Cell(T(p.group), 8) +
             Cell(std::to_string(p.group_size), 6) + Cell(FormatNumber(p.divisor, 5), 10) +
             Cell(FormatNumber(p.expected, 5), 10) + Cell(p.declared > 0 ? FormatNumber(p.declared, 5) : "-", 10) +
             Cell(FormatNumber(p.residual, 3), 11) + "\n";
    }
  } else {
    out += std::string(bold) + "gradtrace-diff " + T(r.a.dir) + " " + T(r.b.dir) + reset + "\n";
    out += "  A: " + T(r.a.producer) + ", " + T(ConfigSummary(r.a.config)) + "\n";
    out += "  B: " + T(r.b.producer) + ", " + T(ConfigSummary(r.b.config)) + "\n";
    out += "  step " + std::to_string(r.step) + ", phase " + T(r.phase) + "; " + T(r.tolerance.bound) + "\n\n";
    if (!r.steps.empty()) {
      out += RenderStepRowsText(r.steps) + "\n" + bold + "Step " + std::to_string(r.step) +
             (r.verdict == "match" ? ", the first" : ", the first that differs") + reset + "\n";
    }
    size_t nw = 9;
    for (size_t i : shown.index) nw = std::max(nw, std::min<size_t>(T(r.params[i].name).size(), 48));
    out += std::string(bold) + Cell("VERDICT", 11, true) + Cell("PARAMETER", nw + 2, true) + Cell("NUMEL", 10) +
           Cell("SCALE", 11) + Cell("RESIDUAL", 11) + Cell("COSINE", 11) + Cell("REL.ERR", 11) + Cell("MAX|ERR|", 11) +
           Cell("BASIS", 8) + reset + "\n";
    for (size_t i : shown.index) {
      const auto& p = r.params[i];
      const Metrics& m = p.metrics;
      bool none = m.basis == Basis::kNone;
      std::string verdict = VerdictName(p.verdict);
      out += Paint(verdict, verdict, colour, 11) + Cell(Clip(T(p.name), 48), nw + 2, true) +
             Cell(std::to_string(p.numel), 10) + Cell(none ? "-" : FormatNumber(m.scale, 6), 11) +
             Cell(none ? "-" : FormatNumber(m.residual, 3), 11) + Cell(none ? "-" : FormatNumber(m.cosine, 6), 11) +
             Cell(none ? "-" : FormatNumber(m.rel_error, 3), 11) + Cell(MaxAbsErrorText(m), 11) +
             Cell(BasisName(m.basis), 8);
      if (!p.note.empty()) out += "  " + T(p.note);
      out += "\n";
    }
  }
  if (shown.hidden > 0) out += "  ... " + shown.rest + " (--top N shows more; --json lists every parameter)\n";
  if (!r.groups.empty()) {
    out += std::string("\n") + bold + (r.mode == "self" ? "Divisors" : "Groups") + reset + "\n";
    for (const auto& g : r.groups) {
      out += "  " + std::to_string(g.count) + " x " + T(g.kind) + ": " + T(g.explanation) + "\n";
    }
  }
  if (!r.findings.empty()) {
    out += std::string("\n") + bold + "Findings" + reset + "\n";
    for (const auto& f : r.findings) out += "  [" + T(f.kind) + "] " + T(f.message) + "\n";
  }
  if (r.grad_norm && r.grad_norm->verdict == "consistent") {
    out += "\nGrad norm: " + T(r.grad_norm->message) + "\n";
  }
  out += std::string("\n") + bold + "Verdict: " + reset + Paint(T(r.verdict), r.verdict, colour, 0);
  if (!r.summary.empty()) out += " -- " + T(r.summary);
  out += "\n";
  return out;
}

}  // namespace gradtrace::diff
