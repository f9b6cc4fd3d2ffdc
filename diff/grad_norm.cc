#include "grad_norm.h"

#include <cmath>

namespace gradtrace::diff {

std::optional<double> ReportedGradNorm(const TraceSet& set, int64_t step) {
  std::optional<double> any;
  for (const RankStep& s : set.steps()) {
    if (s.info.step() != step || !s.info.has_reported_grad_norm()) continue;
    if (s.rank == 0 && s.info.optimizer_step()) return s.info.reported_grad_norm();
    any = s.info.reported_grad_norm();
  }
  return any;
}

namespace {

bool Off(const std::optional<double>& ratio) { return ratio && !(std::fabs(*ratio - 1) <= kGradNormRtol); }

// "B reports 4.737, its FINAL gradients have norm 1.626: off by 2.913x".
std::string Misreport(const char* side, double reported, double computed, double ratio) {
  std::string s = std::string("the reported grad norm of ") + side + " is off by " + FormatNumber(ratio, 6) + "x (" +
                  side + " reports " + FormatNumber(reported, 6) + ", its FINAL gradients have norm " +
                  FormatNumber(computed, 6) + ")";
  if (ratio > 1) s += "; or the gradients were clipped after the norm was taken";
  return s;
}

}  // namespace

std::optional<GradNormCheck> CheckGradNorms(const Report& r) {
  if (r.mode != "diff" || r.phase != "final") return std::nullopt;
  if (!r.a.reported_grad_norm && !r.b.reported_grad_norm) return std::nullopt;
  GradNormCheck g;
  g.reported_a = r.a.reported_grad_norm;
  g.reported_b = r.b.reported_grad_norm;
  double sa = 0, sb = 0;
  for (const ParamResult& p : r.params) {
    // A norm over part of the model proves nothing: every parameter, every element.
    if (p.metrics.basis != Basis::kFull || p.metrics.compared != p.numel) return std::nullopt;
    sa += p.metrics.norm_a * p.metrics.norm_a;
    sb += p.metrics.norm_b * p.metrics.norm_b;
  }
  g.computed_a = std::sqrt(sa);
  g.computed_b = std::sqrt(sb);
  if (g.reported_a && g.computed_a > 0) g.off_a = *g.reported_a / g.computed_a;
  if (g.reported_b && g.computed_b > 0) g.off_b = *g.reported_b / g.computed_b;
  std::vector<std::string> wrong;
  if (Off(g.off_a)) wrong.push_back(Misreport("A", *g.reported_a, g.computed_a, *g.off_a));
  if (Off(g.off_b)) wrong.push_back(Misreport("B", *g.reported_b, g.computed_b, *g.off_b));
  g.verdict = wrong.empty() ? "consistent" : "misreported";
  if (wrong.empty()) {
    g.message = "the reported grad norms agree with the FINAL gradients";
    if (g.reported_a) g.message += " (A " + FormatNumber(*g.reported_a, 6) + ")";
    if (g.reported_b) g.message += " (B " + FormatNumber(*g.reported_b, 6) + ")";
    return g;
  }
  g.message = r.verdict == "match" ? "gradients match; " : "";
  for (size_t i = 0; i < wrong.size(); ++i) g.message += (i ? "; " : "") + wrong[i];
  return g;
}

}  // namespace gradtrace::diff
