#include "compare/align.h"

#include <algorithm>
#include <set>
#include <unordered_map>

#include "slice_codec.h"

namespace gradtrace::diff {

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

const char* PhaseName(pb::Phase phase) {
  switch (phase) {
    case pb::PRE_REDUCE:
      return "pre";
    case pb::POST_REDUCE:
      return "post";
    case pb::FINAL:
      return "final";
    default:
      return "unspecified";
  }
}

std::vector<int64_t> StepsWithPhase(const TraceSet& set, pb::Phase phase) {
  std::set<int64_t> steps;
  for (const FrameRef& f : set.frames()) {
    if (f.phase == phase) steps.insert(f.step);
  }
  return {steps.begin(), steps.end()};
}

namespace {

// B's parameter ids by their name after renaming; InvalidArgument when two names collide.
Expected<std::unordered_map<std::string, int32_t>> RenamedIds(const TraceSet& set,
                                                              const std::vector<RenameRule>& rules) {
  std::unordered_map<std::string, int32_t> by_name;
  for (const auto& p : set.run().params()) {
    std::string n = ApplyRenames(rules, p.name());
    if (!by_name.emplace(n, p.id()).second) {
      return Status::InvalidArgument(set.dir() + ": two parameters are both named '" + n + "' after renaming");
    }
  }
  return by_name;
}

// A's parameter `p` (named `name` after renaming) with B's of that name, if any; problem set when
// B lacks it or holds another shape.
ParamPair PairOfA(const pb::ParamInfo& p, std::string name, const TraceSet& b,
                  const std::unordered_map<std::string, int32_t>& b_by_name) {
  ParamPair pp;
  pp.name = std::move(name);
  pp.name_a = p.name();
  pp.id_a = p.id();
  pp.numel = p.numel();
  pp.shape.assign(p.shape().begin(), p.shape().end());
  pp.dtype_a = p.dtype();
  auto it = b_by_name.find(pp.name);
  if (it == b_by_name.end()) {
    pp.problem = "only in A";
    return pp;
  }
  const auto& q = b.run().params(it->second);
  pp.id_b = q.id();
  pp.name_b = q.name();
  pp.dtype_b = q.dtype();
  std::vector<int64_t> shape_b(q.shape().begin(), q.shape().end());
  if (shape_b != pp.shape || q.numel() != p.numel()) {
    pp.problem = "shape " + ShapeString(pp.shape) + " in A, " + ShapeString(shape_b) + " in B";
  }
  return pp;
}

// B's parameter `q` (named `name` after renaming), which A lacks.
ParamPair PairOfBOnly(const pb::ParamInfo& q, std::string name) {
  ParamPair pp;
  pp.name = std::move(name);
  pp.name_b = q.name();
  pp.id_b = q.id();
  pp.numel = q.numel();
  pp.shape.assign(q.shape().begin(), q.shape().end());
  pp.dtype_b = q.dtype();
  pp.problem = "only in B";
  return pp;
}

// Why no pair can be compared: two different models (the same names with other shapes, which no
// rename rule mends), or no name in common (a hint at --rename).
Status NothingInCommon(const TraceSet& a, const TraceSet& b, const std::vector<ParamPair>& params) {
  for (const ParamPair& pp : params) {
    if (pp.id_a >= 0 && pp.id_b >= 0) {
      return Status::Mismatch(b.dir() + ": a different model from " + a.dir() + " (fingerprint " +
                              b.run().model_fingerprint() + " vs " + a.run().model_fingerprint() + "): '" + pp.name +
                              "' has " + pp.problem);
    }
  }
  std::string hint = a.run().params_size() > 0 && b.run().params_size() > 0
                         ? " (A has '" + a.run().params(0).name() + "', B has '" + b.run().params(0).name() +
                               "'; try --rename 'REGEX=REPL')"
                         : "";
  return Status::InvalidArgument(b.dir() + ": no parameter in common with " + a.dir() + hint);
}

// al->step: `step` when both sides recorded it, else the first step both recorded for al->phase.
Status PickStep(const TraceSet& a, const TraceSet& b, std::optional<int64_t> step, Alignment* al) {
  const pb::Phase phase = al->phase;
  std::vector<int64_t> sa = StepsWithPhase(a, phase), sb = StepsWithPhase(b, phase);
  if (step) {
    for (const auto& [set, steps] : {std::pair{&a, &sa}, std::pair{&b, &sb}}) {
      if (!std::binary_search(steps->begin(), steps->end(), *step)) {
        return Status::InvalidArgument(set->dir() + ": no " + PhaseName(phase) + " records for step " +
                                       std::to_string(*step));
      }
    }
    al->step = *step;
    return Status::Ok();
  }
  std::vector<int64_t> common;
  std::set_intersection(sa.begin(), sa.end(), sb.begin(), sb.end(), std::back_inserter(common));
  if (common.empty()) {
    const TraceSet& lacking = sa.empty() ? a : b;
    return Status::InvalidArgument(lacking.dir() + ": no " + std::string(PhaseName(phase)) +
                                   " records for any step the other trace set has");
  }
  al->step = common.front();
  if (common.size() > 1) {
    al->notes.push_back("compared step " + std::to_string(al->step) + " (first of " + std::to_string(common.size()) +
                        " common steps; --step N selects another)");
  }
  return Status::Ok();
}

}  // namespace

Expected<Alignment> AlignSets(const TraceSet& a, const TraceSet& b, const std::vector<RenameRule>& rules,
                              pb::Phase phase, std::optional<int64_t> step) {
  Alignment al;
  al.phase = phase;
  auto b_by_name = RenamedIds(b, rules);
  if (!b_by_name.ok()) return b_by_name.status();
  std::set<std::string> a_names;
  size_t shared = 0;
  for (const auto& p : a.run().params()) {
    std::string name = ApplyRenames(rules, p.name());
    if (!a_names.insert(name).second) {
      return Status::InvalidArgument(a.dir() + ": two parameters are both named '" + name + "' after renaming");
    }
    al.params.push_back(PairOfA(p, std::move(name), b, *b_by_name));
    if (al.params.back().problem.empty()) ++shared;
  }
  for (const auto& q : b.run().params()) {
    std::string name = ApplyRenames(rules, q.name());
    if (!a_names.count(name)) al.params.push_back(PairOfBOnly(q, std::move(name)));
  }
  if (shared == 0) return NothingInCommon(a, b, al.params);
  GT_RETURN_IF_ERROR(PickStep(a, b, step, &al));
  return al;
}

}  // namespace gradtrace::diff
