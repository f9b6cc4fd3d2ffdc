#include "compare/work_units.h"

#include <algorithm>
#include <numeric>
#include <unordered_map>
#include <utility>

namespace gradtrace::diff {
namespace {

struct DisjointSets {
  std::vector<size_t> parent;
  explicit DisjointSets(size_t n) : parent(n) { std::iota(parent.begin(), parent.end(), 0); }
  size_t Find(size_t x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  }
  void Join(size_t x, size_t y) {
    x = Find(x), y = Find(y);
    if (x != y) parent[std::max(x, y)] = std::min(x, y);
  }
};

// Joins the pairs that share a frame of one side; `pair_of` maps that side's param id to a pair.
void JoinThroughFrames(const std::vector<std::vector<const FrameRef*>>& frames,
                       const std::unordered_map<int32_t, size_t>& pair_of, DisjointSets* sets) {
  for (const auto& per_rank : frames) {
    for (const FrameRef* f : per_rank) {
      size_t first = SIZE_MAX;
      for (int32_t id : f->param_ids) {
        auto it = pair_of.find(id);
        if (it == pair_of.end()) continue;
        if (first == SIZE_MAX) {
          first = it->second;
        } else {
          sets->Join(first, it->second);
        }
      }
    }
  }
}

}  // namespace

std::vector<Unit> MakeUnits(const Alignment& al, const std::vector<std::vector<const FrameRef*>>& frames_a,
                            const std::vector<std::vector<const FrameRef*>>& frames_b, int64_t max_elems) {
  std::unordered_map<int32_t, size_t> pair_a, pair_b;
  for (size_t i = 0; i < al.params.size(); ++i) {
    if (!al.params[i].problem.empty()) continue;
    pair_a.emplace(al.params[i].id_a, i);
    pair_b.emplace(al.params[i].id_b, i);
  }
  // Position of each pair in A's files: (rank, offset) of the first frame holding it.
  std::vector<std::pair<int, uint64_t>> first(al.params.size(), {INT32_MAX, 0});
  for (const auto& per_rank : frames_a) {
    for (const FrameRef* f : per_rank) {
      for (int32_t id : f->param_ids) {
        auto it = pair_a.find(id);
        if (it != pair_a.end()) first[it->second] = std::min(first[it->second], std::make_pair(f->rank, f->offset));
      }
    }
  }
  DisjointSets sets(al.params.size());
  JoinThroughFrames(frames_a, pair_a, &sets);
  JoinThroughFrames(frames_b, pair_b, &sets);

  // Connected groups, each in A's file order, ordered by their first member.
  std::vector<size_t> order;
  for (size_t i = 0; i < al.params.size(); ++i) {
    if (al.params[i].problem.empty()) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return first[x] < first[y]; });
  std::vector<std::vector<size_t>> groups;
  std::unordered_map<size_t, size_t> group_of_root;
  for (size_t i : order) {
    auto [it, inserted] = group_of_root.emplace(sets.Find(i), groups.size());
    if (inserted) groups.emplace_back();
    groups[it->second].push_back(i);
  }

  std::vector<Unit> units;
  int64_t elems = 0;
  auto add = [&](const std::vector<size_t>& pairs, int64_t n) {
    // A unit closes once it holds max_elems, or when n would take it past twice that: so small parameters join
    // their neighbour instead of making units of their own, whose cut frames are read once per unit.
    if (units.empty() || elems >= max_elems || (elems + n > 2 * max_elems && elems > 0)) {
      units.emplace_back();
      elems = 0;
    }
    units.back().pairs.insert(units.back().pairs.end(), pairs.begin(), pairs.end());
    elems += n;
  };
  for (const auto& g : groups) {
    int64_t n = 0;
    for (size_t i : g) n += al.params[i].numel;
    if (n <= 4 * max_elems) {
      add(g, n);
      continue;
    }
    for (size_t i : g) add({i}, al.params[i].numel);
  }
  return units;
}

}  // namespace gradtrace::diff
