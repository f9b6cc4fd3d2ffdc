#include "evidence/evidence.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "compare/align.h"
#include "evidence/self_check.h"

namespace gradtrace::diff {
namespace {

// --self needs both phases at the step; without them a side has no reductions to show.
bool HasReductionsAt(const TraceSet& set, int64_t step) {
  auto pre = StepsWithPhase(set, pb::PRE_REDUCE), post = StepsWithPhase(set, pb::POST_REDUCE);
  return std::binary_search(pre.begin(), pre.end(), step) && std::binary_search(post.begin(), post.end(), step);
}

}  // namespace

std::vector<ReductionEvidence> CollectReductionEvidence(const TraceSet& set, int64_t step, int threads,
                                                        int* accumulating_params) {
  std::vector<ReductionEvidence> out;
  if (accumulating_params != nullptr) *accumulating_params = 0;
  if (!HasReductionsAt(set, step)) return out;
  SelfOptions options;
  options.step = step;
  options.threads = threads;
  options.sample = true;
  options.accumulation = accumulating_params != nullptr;
  options.grad_norm = false;
  options.replicas = false;
  auto self = SelfCheckSet(set, options);
  if (!self.ok()) return out;  // the diff itself does not depend on it
  if (accumulating_params != nullptr) *accumulating_params = self->accumulating_params;
  return EvidenceOfSelf(*self);
}

std::vector<ReductionEvidence> EvidenceOfSelf(const Report& self) {
  std::vector<ReductionEvidence> out;
  // Per kind, the median measured divisor of its parameters (and their expected, declared).
  std::map<std::string, std::vector<const SelfParam*>> by_kind;
  for (const auto& p : self.self_params) {
    if (std::isfinite(p.divisor)) by_kind[p.param_kind].push_back(&p);
  }
  for (auto& [kind, ps] : by_kind) {
    std::sort(ps.begin(), ps.end(), [](const SelfParam* x, const SelfParam* y) { return x->divisor < y->divisor; });
    const SelfParam& mid = *ps[ps.size() / 2];
    out.push_back({kind, mid.group_size, mid.divisor, mid.declared, mid.expected});
  }
  return out;
}

void EvidenceJob::Run() {
  reductions = CollectReductionEvidence(*set, step, 1, count_accumulating ? &accumulating_params : nullptr);
}

int64_t EvidenceJob::Weight() const {
  return HasReductionsAt(*set, step) ? static_cast<int64_t>(SampledBytes(*set, step) / 8) : 0;
}

std::vector<BucketCell> SideBucketView(const TraceSet& set, int64_t step, std::optional<double> rtol, int threads) {
  if (!HasReductionsAt(set, step)) return {};
  SelfOptions options;
  options.step = step;
  options.rtol = rtol;
  options.threads = threads;
  options.grad_norm = false;
  options.replicas = false;
  auto self = SelfCheckSet(set, options);
  if (!self.ok()) return {};
  // Infinite numbers as NaN: the JSON writes both as null, so a merged report (whose shard 0 carried the
  // cells in its partial report) reads back the very cells a single process holds.
  for (BucketCell& c : self->bucket_view) {
    for (double* v : {&c.pre_norm, &c.post_norm, &c.divisor, &c.residual}) {
      if (std::isinf(*v)) *v = std::nan("");
    }
  }
  return std::move(self->bucket_view);
}

void StepLossAndTokens(const TraceSet& set, int64_t step, TraceSide* side) {
  bool any = false;
  double loss = 0;
  for (const RankStep& s : set.steps()) {
    if (s.info.step() == step && !s.info.optimizer_step() && std::isfinite(s.info.loss())) loss += s.info.loss();
  }
  side->loss_per_replica = loss / std::max(1, set.config().dp());
  for (const RankStep& s : set.steps()) {
    if (s.info.step() != step || s.info.optimizer_step() || s.info.valid_tokens() <= 0) continue;
    const int64_t v = s.info.valid_tokens();
    side->valid_tokens_min = any ? std::min(side->valid_tokens_min, v) : v;
    side->valid_tokens_max = any ? std::max(side->valid_tokens_max, v) : v;
    any = true;
  }
}

}  // namespace gradtrace::diff
