#include "report/violations.h"

#include <algorithm>
#include <map>
#include <set>

#include "cause.h"
#include "text_escape.h"

namespace gradtrace::diff {

namespace {

// Finding kinds (report.schema.json) that are violations, and the check each belongs to.
const std::map<std::string, std::string>& FindingChecks() {
  static const std::map<std::string, std::string> checks = {
      {"replica", "replicas"}, {"nonfinite", "non-finite"}, {"skipped", "skipped-step"}, {"grad-norm", "grad-norm"}};
  return checks;
}

std::string CauseOf(const Group& g) { return g.cause ? semantics::CauseName(*g.cause) : ""; }

}  // namespace

std::vector<Violation> SelfViolations(const Report& self) {
  std::map<std::string, const SelfParam*> by_name;
  for (const SelfParam& p : self.self_params) by_name.emplace(p.name, &p);
  std::vector<Violation> out;
  for (const Group& g : self.groups) {
    std::set<int32_t> buckets;
    bool bad = false;
    for (const std::string& name : g.params) {
      auto it = by_name.find(name);
      if (it == by_name.end()) continue;
      bad |= it->second->verdict == SelfVerdict::kWrongDivisor || it->second->verdict == SelfVerdict::kInconsistent;
      buckets.insert(it->second->buckets.begin(), it->second->buckets.end());
    }
    if (bad) out.push_back({"divisor", CauseOf(g), g.explanation, g.params, {buckets.begin(), buckets.end()}, g.scale});
  }
  for (const Finding& f : self.findings) {
    auto check = FindingChecks().find(f.kind);
    if (check != FindingChecks().end()) out.push_back({check->second, "", f.message, {}, {}, std::nullopt});
  }
  return out;
}

std::vector<Violation> ReferenceViolations(const Report& against) {
  std::map<std::string, Verdict> verdict;
  for (const ParamResult& p : against.params) verdict.emplace(p.name, p.verdict);
  std::vector<Violation> out;
  for (const Group& g : against.groups) {
    const bool differs = std::any_of(g.params.begin(), g.params.end(), [&](const std::string& name) {
      auto it = verdict.find(name);
      return it != verdict.end() && it->second != Verdict::kMatch;
    });
    if (differs) {
      out.push_back(
          {"reference", CauseOf(g), "against the reference run (A): " + g.explanation, g.params, {}, std::nullopt});
    }
  }
  return out;
}

std::string ViolationLine(int rank, int64_t step, const Violation& v) {
  std::string where;
  if (!v.buckets.empty()) {
    const auto& bs = v.buckets;
    if (bs.size() == 1) {
      where = "bucket " + std::to_string(bs[0]);
    } else {
      where = "buckets ";
      for (size_t i = 0; i < std::min<size_t>(bs.size(), 6); ++i) where += (i ? ", " : "") + std::to_string(bs[i]);
      if (bs.size() > 6) where += " ...";
    }
    where += " (" + std::to_string(v.params.size()) + " parameter" + (v.params.size() != 1 ? "s" : "") + "): ";
  }
  return TerminalSafe("gradtrace guard: rank " + std::to_string(rank) + ": step " + std::to_string(step) + ": " +
                      where + v.message);
}

}  // namespace gradtrace::diff
