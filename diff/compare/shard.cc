#include "compare/shard.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <queue>

namespace gradtrace::diff {

Expected<Shard> ParseShard(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("--shard " + text + ": " + why + " (expected K/N with 0 <= K < N)");
  };
  size_t slash = text.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == text.size()) return bad("not K/N");
  auto number = [](const std::string& s, int* out) {
    if (s.empty() || s.size() > 9 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return false;
    *out = std::stoi(s);
    return true;
  };
  Shard s;
  if (!number(text.substr(0, slash), &s.k) || !number(text.substr(slash + 1), &s.n)) return bad("not K/N");
  if (s.n < 1) return bad("N must be at least 1");
  if (s.k >= s.n) return bad("K must be below N");
  return s;
}

std::vector<size_t> ShardItems(const std::vector<int64_t>& weights, Shard shard) {
  std::vector<size_t> order(weights.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return weights[x] > weights[y]; });
  // (load, k), smallest first: the least-loaded share, lower k on ties.
  using Load = std::pair<int64_t, int>;
  std::priority_queue<Load, std::vector<Load>, std::greater<Load>> loads;
  for (int k = 0; k < shard.n; ++k) loads.push({0, k});
  std::vector<size_t> mine;
  for (size_t i : order) {
    Load l = loads.top();
    loads.pop();
    if (l.second == shard.k) mine.push_back(i);
    loads.push({l.first + weights[i], l.second});
  }
  std::sort(mine.begin(), mine.end());
  return mine;
}

std::string Fingerprint(const std::string& text) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace gradtrace::diff
