#include "report/rows.h"

#include <algorithm>
#include <map>

namespace gradtrace::diff {
namespace {

bool Problem(const ParamResult& p) { return Severity(p.verdict) >= Severity(Verdict::kMissing); }
bool Problem(const SelfParam& p) {
  return p.verdict == SelfVerdict::kWrongDivisor || p.verdict == SelfVerdict::kInconsistent;
}
std::string NameOf(const ParamResult& p) { return VerdictName(p.verdict); }
std::string NameOf(const SelfParam& p) { return SelfVerdictName(p.verdict); }

template <typename Param>
ShownRows Select(const std::vector<Param>& params, size_t top) {
  ShownRows out;
  std::map<std::string, size_t> hidden;  // verdict -> rows not shown
  for (size_t i = 0; i < params.size(); ++i) {
    if (i < top || (Problem(params[i]) && out.index.size() < std::max(top, kMaxProblemRows))) {
      out.index.push_back(i);
    } else {
      ++hidden[NameOf(params[i])];
      ++out.hidden;
    }
  }
  if (out.hidden == 0) return out;
  out.rest = Thousands(out.hidden) + " more:";
  std::vector<std::pair<size_t, std::string>> by_count;
  for (const auto& [verdict, n] : hidden) by_count.emplace_back(n, verdict);
  std::stable_sort(by_count.begin(), by_count.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
  for (size_t i = 0; i < by_count.size(); ++i) {
    out.rest += (i ? ", " : " ") + Thousands(by_count[i].first) + " " + by_count[i].second;
  }
  return out;
}

}  // namespace

ShownRows RowsForPeople(const Report& r, size_t top, size_t fallback) {
  if (top == 0) top = fallback;
  return r.mode == "self" ? Select(r.self_params, top) : Select(r.params, top);
}

std::string ShortName(const std::string& name, size_t width) {
  if (name.size() <= width || width < 8) return name;
  const char* const kEllipsis = "\u2026";
  const size_t keep = width - 3, head_len = keep / 3;
  size_t head = head_len, tail = name.size() - (keep - head_len);
  while (head > 0 && (static_cast<unsigned char>(name[head]) & 0xC0) == 0x80) --head;  // UTF-8 boundaries
  while (tail < name.size() && (static_cast<unsigned char>(name[tail]) & 0xC0) == 0x80) ++tail;
  return name.substr(0, head) + kEllipsis + name.substr(tail);
}

std::string Thousands(size_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace gradtrace::diff
