#include "explain.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

namespace gradtrace::diff {
namespace {

struct Atom {
  const char* kind;
  double (*get)(const pb::Config&);
};

const Atom kAtoms[] = {
    {"sp", [](const pb::Config& c) { return double(c.sp()); }},
    {"dp", [](const pb::Config& c) { return double(c.dp()); }},
    {"world", [](const pb::Config& c) { return double(c.world()); }},
    {"gas", [](const pb::Config& c) { return double(c.gas()); }},
    {"experts", [](const pb::Config& c) { return double(c.moe_experts()); }},
    {"ep", [](const pb::Config& c) { return double(c.ep_size()); }},
    {"predivide", [](const pb::Config& c) { return c.gradient_predivide_factor(); }},
};

int KindRank(const std::string& kind) {
  static const std::map<std::string, int> order = {{"one", 0}, {"sp", 1},        {"dp", 2},      {"world", 3},
                                                   {"gas", 4}, {"predivide", 5}, {"experts", 6}, {"ep", 7}};
  auto it = order.find(kind);
  return it == order.end() ? 9 : it->second;
}

std::string Fixed(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f", v);
  return buf;
}

bool HasPolicy(const pb::Config& c, const char* what) { return c.scaling().find(what) != std::string::npos; }

// Why a configuration's gradient carries its own SP degree as an extra factor.
std::string SpWhy(const pb::Config& c) {
  bool local_mean = c.loss() == "local-mean";
  if (local_mean && HasPolicy(c, "deepspeed") && c.zero_stage() == 3) {
    // Only stage 3's all-reduce path divides by dp (stage3.py:1878); its default reduce-scatter path divides by dp x
    // sp.
    return "the per-rank loss is a local mean and the reduction divides by dp only (DeepSpeed ZeRO-3 with "
           "reduce_scatter false, stage3.py all-reduce path)";
  }
  if (local_mean && (HasPolicy(c, "4530") || HasPolicy(c, "deepspeed"))) {
    return "the per-rank loss is a local mean and the reduction divides by dp only (DeepSpeed ZeRO-1/2 since #4530)";
  }
  if (local_mean) {
    return "the per-rank loss is a local mean over its sequence shard and the reduction divides by dp, not dp x sp";
  }
  return "each sequence-parallel rank's gradient is a full-size contribution and the reduction does not divide by sp";
}

std::string Why(const Candidate& c, const pb::Config& a, const pb::Config& b) {
  const pb::Config& cfg = c.side == 'A' ? a : b;
  const char* who = c.side == 'A' ? "A" : "B";
  // A factor of an A-side atom means A carries the error (B/A = 1/x(A)).
  bool up = c.side == 'A' ? c.reciprocal : !c.reciprocal;
  std::string side_text = std::string(who);
  if (c.kind == "one") return "B matches A";
  if (c.kind == "sp") {
    if (c.side == 'R') return "the factor follows the ratio of sequence-parallel degrees: " + SpWhy(b);
    if (up) return SpWhy(cfg);
    if (cfg.loss() == "local-mean-div-sp" && (HasPolicy(cfg, "mean") || cfg.scaling().empty())) {
      return side_text + " divides by sp twice: the loss recipe divides by sp and the reduction averages over dp x sp";
    }
    return side_text + " divides by its sequence-parallel degree once more than needed";
  }
  if (c.kind == "dp") {
    return up ? side_text + " sums the data-parallel ranks' gradients without dividing by dp"
              : side_text + " divides by dp once more than needed";
  }
  if (c.kind == "world") {
    return up ? side_text + " sums over all ranks without dividing (a 'sum' reduction)"
              : side_text + " divides by the world size once more than needed";
  }
  if (c.kind == "gas") {
    return up ? side_text + " adds its gradient-accumulation micro-steps without dividing the loss by gas"
              : side_text + " divides by the accumulation steps twice (loss and gradient)";
  }
  if (c.kind == "predivide") {
    return up ? side_text + " multiplies back the gradient_predivide_factor that was never divided out"
              : side_text + " pre-divides by gradient_predivide_factor and never multiplies back";
  }
  if (c.kind == "experts" || c.kind == "ep") {
    return "expert gradients are reduced over the expert-data-parallel group and divided by the wrong group size (" +
           c.expr + ")";
  }
  return "";
}

}  // namespace

std::vector<Candidate> ScaleCandidates(const pb::Config& a, const pb::Config& b) {
  std::vector<Candidate> out;
  out.push_back({"1", 1.0, "one", false, 'B', 0});
  for (const Atom& atom : kAtoms) {
    double va = atom.get(a), vb = atom.get(b);
    std::string k = atom.kind;
    if (vb > 1) {
      out.push_back({k + "(B)", vb, k, false, 'B', 1});
      out.push_back({"1/" + k + "(B)", 1 / vb, k, true, 'B', 2});
    }
    if (va > 1) {
      out.push_back({k + "(A)", va, k, false, 'A', 1});
      out.push_back({"1/" + k + "(A)", 1 / va, k, true, 'A', 2});
    }
    if (va > 1 && vb > 1 && va != vb) {
      out.push_back({k + "(B)/" + k + "(A)", vb / va, k, false, 'R', 3});
      out.push_back({k + "(A)/" + k + "(B)", va / vb, k, true, 'R', 3});
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Candidate& x, const Candidate& y) {
    if (x.complexity != y.complexity) return x.complexity < y.complexity;
    if (x.side != y.side) return x.side == 'B';
    return KindRank(x.kind) < KindRank(y.kind);
  });
  return out;
}

std::vector<Candidate> MatchFactor(double value, const std::vector<Candidate>& candidates, double ctol) {
  std::vector<Candidate> out;
  if (!std::isfinite(value)) return out;
  for (const auto& c : candidates) {
    if (std::fabs(value - c.value) <= ctol * std::fabs(c.value)) out.push_back(c);
  }
  return out;
}

bool SpRanksSumToSequenceLoss(const std::string& loss) {
  return loss == "local-mean-div-sp" || loss == "token-weighted" || loss == "full-sequence" ||
         loss == "global-token-weighted" || loss == "alst-tutorial-div-sp";
}

std::optional<double> PredictedMultiple(const pb::Config& c) {
  double dp = std::max(1, c.dp()), sp = std::max(1, c.sp()), world = dp * sp;
  double share;
  if (c.loss() == "local-mean") {
    share = world;
  } else if (SpRanksSumToSequenceLoss(c.loss())) {
    share = dp;
  } else {
    return std::nullopt;
  }
  const std::string& s = c.scaling();
  if (s == "mean") return share / world;
  if (s == "ds-4530") return share / dp;
  if (s == "sum") return share;
  if (s == "ds-pre-4957") return share / (world * sp);
  return std::nullopt;
}

double ClusterTolerance(double rtol) { return std::clamp(10 * rtol, 1e-6, 0.01); }

std::string ExplainScale(double scale, int count, int total, const pb::Config& a, const pb::Config& b, double ctol,
                         std::string* expression) {
  std::string which = count == total ? "for all " + std::to_string(total) + " parameters"
                                     : "for " + std::to_string(count) + " of " + std::to_string(total) + " parameters";
  if (count == 1 && total == 1) which = "for the only parameter";
  auto matches = MatchFactor(scale, ScaleCandidates(a, b), ctol);
  if (matches.empty()) {
    if (expression) expression->clear();
    return "B/A = " + Fixed(scale) + " " + which +
           ": matches no expression of the two configurations (sp, dp, world, gas, experts, ep size, predivide factor)";
  }
  const Candidate& best = matches.front();
  if (expression) *expression = best.expr;
  std::string s = "B/A = " + Fixed(scale) + " = " + best.expr + " " + which + ": " + Why(best, a, b);
  // The configurations' own prediction settles an ambiguous factor; without
  // it, name the other readings rather than pretend to know.
  auto pa = PredictedMultiple(a), pb_ = PredictedMultiple(b);
  bool predicted = false;
  if (pa && pb_ && *pa > 0) {
    double want = *pb_ / *pa;
    predicted = std::fabs(scale - want) <= ctol * want;
    if (!predicted) s += "; the configurations predict B/A = " + Fixed(want);
  }
  std::vector<std::string> also;
  for (size_t i = 1; i < matches.size() && !predicted; ++i) {
    if (matches[i].kind != best.kind && matches[i].complexity <= best.complexity + 1) also.push_back(matches[i].expr);
  }
  if (!also.empty()) {
    s += " (the factor also equals ";
    for (size_t i = 0; i < also.size(); ++i) s += (i ? ", " : "") + also[i];
    s += ")";
  }
  return s;
}

std::vector<Group> GroupParams(const std::vector<ParamResult>& params, const pb::Config& a, const pb::Config& b,
                               double rtol) {
  std::vector<Group> groups;
  double ctol = ClusterTolerance(rtol);
  int total = static_cast<int>(params.size());
  std::vector<const ParamResult*> scalable;
  for (const auto& p : params) {
    if ((p.verdict == Verdict::kMatch || p.verdict == Verdict::kScaled) && std::isfinite(p.metrics.scale)) {
      scalable.push_back(&p);
    }
  }
  std::sort(scalable.begin(), scalable.end(),
            [](const ParamResult* x, const ParamResult* y) { return x->metrics.scale < y->metrics.scale; });
  for (size_t i = 0; i < scalable.size();) {
    double first = scalable[i]->metrics.scale;
    size_t j = i;
    while (j < scalable.size() && std::fabs(scalable[j]->metrics.scale - first) <= ctol * std::fabs(first)) ++j;
    Group g;
    g.kind = "scale";
    g.scale = scalable[(i + j) / 2]->metrics.scale;  // median
    g.count = static_cast<int>(j - i);
    for (size_t k = i; k < j; ++k) g.params.push_back(scalable[k]->name);
    g.explanation = ExplainScale(*g.scale, g.count, total, a, b, ctol, &g.expression);
    groups.push_back(std::move(g));
    i = j;
  }
  for (Verdict v : {Verdict::kMismatch, Verdict::kMissing, Verdict::kNonfinite}) {
    Group g;
    g.kind = VerdictName(v);
    for (const auto& p : params) {
      if (p.verdict == v) g.params.push_back(p.name);
    }
    g.count = static_cast<int>(g.params.size());
    if (g.count == 0) continue;
    std::string n = std::to_string(g.count) + (g.count == 1 ? " parameter" : " parameters");
    const char* are = g.count == 1 ? " is" : " are";
    if (v == Verdict::kMismatch) g.explanation = n + " of B" + are + " not a multiple of A (residual above tolerance)";
    if (v == Verdict::kMissing) g.explanation = n + " could not be compared (absent, shape differs, or incomplete)";
    if (v == Verdict::kNonfinite) g.explanation = n + " hold NaN or Inf";
    groups.push_back(std::move(g));
  }
  std::stable_sort(groups.begin(), groups.end(), [](const Group& x, const Group& y) { return x.count > y.count; });
  return groups;
}

}  // namespace gradtrace::diff
