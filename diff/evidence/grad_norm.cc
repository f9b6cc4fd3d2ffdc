#include "evidence/grad_norm.h"

#include <cmath>
#include <map>
#include <mutex>

#include "evidence/bucket_view.h"
#include "load/gather.h"
#include "load/thread_pool.h"

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

// "the reported grad norm of B is off by 2.913x (B reports 4.737, its FINAL gradients have norm 1.626)";
// side "" (--self): "the reported grad norm is off by ... (the run reports ...".
std::string Misreport(const std::string& side, double reported, double computed, double ratio) {
  std::string s = "the reported grad norm" + (side.empty() ? "" : " of " + side) + " is off by " +
                  FormatNumber(ratio, 6) + "x (" + (side.empty() ? "the run" : side) + " reports " +
                  FormatNumber(reported, 6) + ", its FINAL gradients have norm " + FormatNumber(computed, 6) + ")";
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

void FinalNormSum::Add(const std::vector<int32_t>& ids, const std::vector<SideValues>& values) {
  double sum = 0;
  bool complete = true;
  for (const SideValues& v : values) {
    complete &= v.complete();
    sum += SquaredNorm(v);
  }
  std::lock_guard<std::mutex> lock(mu_);
  squares_[ids.empty() ? -1 : ids.front()] = sum;
  whole_ &= complete;
}

std::optional<double> FinalNormSum::Norm() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!whole_) return std::nullopt;
  double total = 0;
  for (const auto& [first, sum] : squares_) total += sum;
  return std::sqrt(total);
}

Status VisitFinal(const TraceSet& set, int64_t step, int threads,
                  const std::function<void(const std::vector<int32_t>&, const std::vector<SideValues>&)>& visit) {
  Selection sel;
  sel.step = step;
  sel.phase = pb::FINAL;
  const auto frames = SelectFrames(set, sel);
  std::vector<int32_t> ids(set.run().params_size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  // Batches of 4M elements bound the memory; each batch is one unit of work.
  const auto batches = BatchParams(set, ids, int64_t{1} << 22);
  const int workers = ResolveThreads(threads);
  std::vector<ReaderCache> caches(workers);
  std::mutex mu;
  Status first_error;
  ParallelFor(batches.size(), workers, [&](size_t b, int worker) {
    std::vector<SideValues> values;
    Status st = GatherParams(set, frames, batches[b], Combine::kReplicas, &caches[worker], &values);
    if (!st.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      if (first_error.ok()) first_error = std::move(st);
      return;
    }
    visit(batches[b], values);
  });
  return first_error;
}

void AddSelfGradNorm(std::optional<double> reported, std::optional<double> final_norm, Report* report) {
  report->a.reported_grad_norm = reported;
  if (!reported || !final_norm) return;
  GradNormCheck g;
  g.reported_a = reported;
  g.computed_a = *final_norm;
  g.computed_b = std::nan("");  // one set: no side B
  if (g.computed_a > 0) g.off_a = *reported / g.computed_a;
  if (!Off(g.off_a)) {
    g.verdict = "consistent";
    g.message = "the reported grad norm agrees with the FINAL gradients (" + FormatNumber(*reported, 6) + ")";
  } else {
    g.verdict = "misreported";
    g.message = std::string(report->verdict == "ok" ? "gradients match (reductions as expected); " : "") +
                Misreport("", *reported, g.computed_a, *g.off_a);
    report->findings.push_back({"grad-norm", g.message});
    if (report->verdict == "ok") report->summary = g.message;
  }
  report->grad_norm = std::move(g);
}

}  // namespace gradtrace::diff
