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

Expected<Alignment> AlignSets(const TraceSet& a, const TraceSet& b, const std::vector<RenameRule>& rules,
                              pb::Phase phase, std::optional<int64_t> step) {
  Alignment al;
  al.phase = phase;
  std::unordered_map<std::string, int32_t> b_by_name;
  for (const auto& p : b.run().params()) {
    std::string n = ApplyRenames(rules, p.name());
    if (!b_by_name.emplace(n, p.id()).second) {
      return Status::InvalidArgument(b.dir() + ": two parameters are both named '" + n + "' after renaming");
    }
  }
  std::set<std::string> a_names;
  size_t shared = 0;
  for (const auto& p : a.run().params()) {
    ParamPair pp;
    pp.name = ApplyRenames(rules, p.name());
    if (!a_names.insert(pp.name).second) {
      return Status::InvalidArgument(a.dir() + ": two parameters are both named '" + pp.name + "' after renaming");
    }
    pp.name_a = p.name();
    pp.id_a = p.id();
    pp.numel = p.numel();
    pp.shape.assign(p.shape().begin(), p.shape().end());
    pp.dtype_a = p.dtype();
    auto it = b_by_name.find(pp.name);
    if (it == b_by_name.end()) {
      pp.problem = "only in A";
    } else {
      const auto& q = b.run().params(it->second);
      pp.id_b = q.id();
      pp.name_b = q.name();
      pp.dtype_b = q.dtype();
      std::vector<int64_t> shape_b(q.shape().begin(), q.shape().end());
      if (shape_b != pp.shape || q.numel() != p.numel()) {
        pp.problem = "shape " + ShapeString(pp.shape) + " in A, " + ShapeString(shape_b) + " in B";
      } else {
        ++shared;
      }
    }
    al.params.push_back(std::move(pp));
  }
  for (const auto& q : b.run().params()) {
    std::string n = ApplyRenames(rules, q.name());
    if (a_names.count(n)) continue;
    ParamPair pp;
    pp.name = n;
    pp.name_b = q.name();
    pp.id_b = q.id();
    pp.numel = q.numel();
    pp.shape.assign(q.shape().begin(), q.shape().end());
    pp.dtype_b = q.dtype();
    pp.problem = "only in B";
    al.params.push_back(std::move(pp));
  }
  if (shared == 0) {
    // Same names with other shapes: two different models, which no rename rule mends.
    for (const ParamPair& pp : al.params) {
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

  std::vector<int64_t> sa = StepsWithPhase(a, phase), sb = StepsWithPhase(b, phase);
  if (step) {
    if (!std::binary_search(sa.begin(), sa.end(), *step)) {
      return Status::InvalidArgument(a.dir() + ": no " + PhaseName(phase) + " records for step " +
                                     std::to_string(*step));
    }
    if (!std::binary_search(sb.begin(), sb.end(), *step)) {
      return Status::InvalidArgument(b.dir() + ": no " + PhaseName(phase) + " records for step " +
                                     std::to_string(*step));
    }
    al.step = *step;
  } else {
    std::vector<int64_t> common;
    std::set_intersection(sa.begin(), sa.end(), sb.begin(), sb.end(), std::back_inserter(common));
    if (common.empty()) {
      const TraceSet& lacking = sa.empty() ? a : b;
      return Status::InvalidArgument(lacking.dir() + ": no " + std::string(PhaseName(phase)) +
                                     " records for any step the other trace set has");
    }
    al.step = common.front();
    if (common.size() > 1) {
      al.notes.push_back("compared step " + std::to_string(al.step) + " (first of " + std::to_string(common.size()) +
                         " common steps; --step N selects another)");
    }
  }
  return al;
}

}  // namespace gradtrace::diff
