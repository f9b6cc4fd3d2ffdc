#include "explain/localise.h"

#include <map>

namespace gradtrace::diff {

namespace {

// "a.b.c" -> {"a", "a.b"}: the modules a parameter belongs to, root excluded, outermost first.
std::vector<std::string> ModulesOf(const std::string& name) {
  std::vector<std::string> out;
  for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', dot + 1)) {
    out.push_back(name.substr(0, dot));
  }
  return out;
}

size_t Depth(const std::string& module) {
  size_t d = 1;
  for (char c : module) d += c == '.';
  return d;
}

}  // namespace

std::optional<Localisation> LocateMismatch(const std::vector<std::pair<std::string, bool>>& params) {
  struct Counts {
    int differ = 0, agree = 0;
    size_t last_differ = 0;  // index of its last differing parameter
  };
  std::map<std::string, Counts> modules;
  Localisation where;
  for (size_t i = 0; i < params.size(); ++i) {
    const bool differs = params[i].second;
    (differs ? where.differ : where.agree) += 1;
    for (const std::string& m : ModulesOf(params[i].first)) {
      Counts& c = modules[m];
      (differs ? c.differ : c.agree) += 1;
      if (differs) c.last_differ = i;
    }
  }
  if (where.differ == 0) return std::nullopt;
  const std::string* within = nullptr;
  for (const auto& [name, c] : modules) {
    if (c.differ == 0 || c.agree == 0) continue;
    // the deepest; among equals the one whose difference comes last in the model's order
    if (within == nullptr || Depth(name) > Depth(*within) ||
        (Depth(name) == Depth(*within) && c.last_differ > modules[*within].last_differ)) {
      within = &name;
    }
  }
  if (within == nullptr) return std::nullopt;
  const Counts& c = modules[*within];
  where.within = *within;
  where.param = params[c.last_differ].first;
  const size_t next = where.param.find('.', within->size() + 1);
  where.module = next == std::string::npos ? where.param : where.param.substr(0, next);
  where.differ_module = where.module == where.param ? 1 : modules[where.module].differ;
  where.differ_within = c.differ;
  where.agree_within = c.agree;
  return where;
}

std::string LocalisationWords(const Localisation& where) {
  auto count = [](int n, const char* one, const char* many) { return std::to_string(n) + (n == 1 ? one : many); };
  std::string s = "; it enters at '" + where.module + "': of the parameters of '" + where.within + "', ";
  s += where.module == where.param ? std::string("it differs")
                                   : "the " + count(where.differ_module, " in it differs", " in it differ");
  s += " and the " + count(where.agree_within, " other agrees", " others agree") + " with A";
  const int elsewhere = where.differ_within - where.differ_module;
  if (elsewhere > 0) s += " (" + count(elsewhere, " more differs", " more differ") + " beside it)";
  return s + "; in all, " + std::to_string(where.differ) + " of the model's " +
         std::to_string(where.differ + where.agree) +
         (where.differ == 1 ? " parameters differs" : " parameters differ");
}

}  // namespace gradtrace::diff
