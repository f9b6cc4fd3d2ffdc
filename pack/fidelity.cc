#include "fidelity.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <unordered_map>

#include "trace_reader.h"

namespace gradtrace::pack {

std::string HumanBytes(double bytes) {
  char buf[32];
  if (bytes >= 1e9) {
    std::snprintf(buf, sizeof buf, "%.2f GB", bytes / 1e9);
  } else if (bytes >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.2f MB", bytes / 1e6);
  } else if (bytes >= 1e3) {
    std::snprintf(buf, sizeof buf, "%.1f kB", bytes / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  }
  return buf;
}

Expected<Costs> MeasureCosts(const std::vector<const diff::TraceSet*>& sets,
                             const std::function<void(uint64_t, uint64_t)>& progress) {
  Costs out;
  const pb::RunInfo& run = sets.front()->run();
  std::unordered_map<std::string, size_t> by_name;
  for (const pb::ParamInfo& p : run.params()) {
    by_name.emplace(p.name(), out.params.size());
    out.params.push_back({p.name(), p.numel(), 0, 0, 0});
  }
  uint64_t total = 0, done = 0;
  for (const diff::TraceSet* s : sets) total += s->total_bytes();
  double attributed = 0;
  for (const diff::TraceSet* s : sets) {
    for (const diff::RankFile& f : s->ranks()) {
      auto opened = TraceReader::Open(f.source);
      if (!opened.ok()) return opened.status();
      TraceReader& r = **opened;
      out.total_bytes += r.file_size();
      Frame frame;
      while (r.Next(&frame)) {
        if (!frame.bucket || frame.raw_len == 0) continue;
        for (const pb::Slice& slice : frame.bucket->slices()) {
          if (!slice.has_full()) continue;
          const pb::ParamInfo& p = r.run_info().params(slice.param_id());  // ids checked by the reader
          auto it = by_name.find(p.name());
          if (it == by_name.end()) {  // a parameter only this set has
            it = by_name.emplace(p.name(), out.params.size()).first;
            out.params.push_back({p.name(), p.numel(), 0, 0, 0});
          }
          ParamCost& c = out.params[it->second];
          const double share = static_cast<double>(frame.stored_len) * slice.full().data().size() / frame.raw_len;
          c.full_bytes += share;
          attributed += share;
          c.copies += c.numel > 0 ? static_cast<double>(slice.count()) / c.numel : 0;
          ++c.full_slices;
        }
      }
      // A truncated file keeps what it has; corruption is the user's to fix first.
      if (!r.status().ok() && r.status().code() != Status::Code::kTruncated) return r.status();
      done += r.file_size();
      if (progress) progress(done, total);
    }
  }
  out.fixed_bytes = out.total_bytes - static_cast<uint64_t>(std::min<double>(attributed, out.total_bytes));
  return out;
}

namespace {

double StatsBytes(const ParamCost& c) { return c.full_slices * kStatsSliceBytes; }
double SketchBytes(const ParamCost& c, int64_t k) {
  return c.full_slices * kSketchSliceBytes + k * c.copies * kSketchValueBytes;
}

// The largest K whose sketch costs at most `bytes`, rounded down to two
// significant digits (a K people can read); 0 when below kMinSketchK.
int32_t LargestK(const ParamCost& c, double bytes, int64_t cap) {
  if (c.copies <= 0) return 0;
  double k = std::floor((bytes - c.full_slices * kSketchSliceBytes) / (c.copies * kSketchValueBytes));
  k = std::min<double>(k, static_cast<double>(cap));
  k = std::min<double>(k, 1 << 30);
  if (k < kMinSketchK) return 0;
  const double unit = std::pow(10.0, std::floor(std::log10(k)) - 1);
  return static_cast<int32_t>(std::floor(k / unit) * unit);
}

// The parameters' indices in `priority` order, the rest after them in table order.
std::vector<size_t> PriorityOrder(const Costs& costs, const std::vector<std::string>& priority) {
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < costs.params.size(); ++i) index.emplace(costs.params[i].name, i);
  std::vector<size_t> order;
  std::set<size_t> placed;
  for (const std::string& name : priority) {
    auto it = index.find(name);
    if (it != index.end() && placed.insert(it->second).second) order.push_back(it->second);
  }
  for (size_t i = 0; i < costs.params.size(); ++i) {
    if (placed.insert(i).second) order.push_back(i);
  }
  return order;
}

// The choices while the budget is spent: every parameter starts as stats,
// then each round moves parameters to dearer modes while they fit in what is
// left.
class Planner {
 public:
  Planner(const Costs& costs, std::vector<size_t> order)
      : costs_(costs), order_(std::move(order)), choice_(costs.params.size()) {}

  // Stats for every parameter (full where nothing can be re-encoded); returns what is left of `budget`,
  // negative when even that does not fit.
  double StartAsStats(double budget) {
    left_ = budget - static_cast<double>(costs_.fixed_bytes);
    for (size_t i = 0; i < costs_.params.size(); ++i) {
      const ParamCost& c = costs_.params[i];
      choice_[i].name = c.name;
      choice_[i].mode.kind = c.full_slices == 0 ? CaptureMode::Kind::kFull : CaptureMode::Kind::kStats;
      choice_[i].est_bytes = StatsBytes(c);
      left_ -= choice_[i].est_bytes;
    }
    return left_;
  }

  // Round 1, breadth: the largest K up to kBreadthSketchK that every
  // parameter can have at once (full where that is no dearer); when not even
  // kMinSketchK fits for all, parameters take it in priority order instead.
  void Breadth() {
    const int64_t breadth_k = BreadthK();
    for (size_t i : order_) {
      const ParamCost& c = costs_.params[i];
      if (c.full_slices == 0) continue;
      const int64_t k = std::min<int64_t>(breadth_k, c.numel / 2);
      if ((k < kMinSketchK || c.full_bytes <= SketchBytes(c, k)) && Take(i, kFull, c.full_bytes)) continue;
      if (k >= kMinSketchK) Take(i, {CaptureMode::Kind::kSketch, static_cast<int32_t>(k)}, SketchBytes(c, k));
    }
  }

  // Round 2, depth, in priority order: full if it fits, else the largest K.
  void Depth() {
    for (size_t i : order_) {
      const ParamCost& c = costs_.params[i];
      if (c.full_slices == 0 || choice_[i].mode.kind == CaptureMode::Kind::kFull) continue;
      if (Take(i, kFull, c.full_bytes)) continue;
      const int32_t k = LargestK(c, choice_[i].est_bytes + left_, c.numel / 2);
      if (k > choice_[i].mode.k) Take(i, {CaptureMode::Kind::kSketch, k}, SketchBytes(c, k));
    }
  }

  // The choices with their README lines, in priority order, so the README lists what differs first.
  std::vector<Choice> Explained(const std::map<std::string, std::string>& differs) {
    for (size_t i = 0; i < choice_.size(); ++i) {
      const ParamCost& c = costs_.params[i];
      auto d = differs.find(c.name);
      const std::string status = d == differs.end() ? "matches" : "differs (" + d->second + ")";
      if (c.full_slices == 0) {
        choice_[i].why = "captured as sketch or stats: kept";
      } else if (choice_[i].mode.kind == CaptureMode::Kind::kFull) {
        choice_[i].why = status + "; full fits (" + HumanBytes(c.full_bytes) + ")";
      } else {
        choice_[i].why = status + "; full needs " + HumanBytes(c.full_bytes) + ", more than was left";
      }
    }
    std::vector<Choice> ordered;
    for (size_t i : order_) ordered.push_back(choice_[i]);
    return ordered;
  }

 private:
  static constexpr CaptureMode kFull{CaptureMode::Kind::kFull, 0};

  // Tries to move parameter i to `mode` costing `bytes`; true when it fits.
  bool Take(size_t i, CaptureMode mode, double bytes) {
    const double extra = bytes - choice_[i].est_bytes;
    if (extra > left_) return false;
    left_ -= extra;
    choice_[i].mode = mode;
    choice_[i].est_bytes = bytes;
    return true;
  }

  // What giving every parameter sketch:k (or full, when no dearer) would add.
  double BreadthCost(int64_t k) const {
    double extra = 0;
    for (size_t i : order_) {
      const ParamCost& c = costs_.params[i];
      if (c.full_slices == 0) continue;
      const int64_t ki = std::min<int64_t>(k, c.numel / 2);
      const double best = ki >= kMinSketchK ? std::min(c.full_bytes, SketchBytes(c, ki)) : c.full_bytes;
      if (best <= left_ + choice_[i].est_bytes) extra += std::max(0.0, best - choice_[i].est_bytes);
    }
    return extra;
  }

  // Round 1's K: the largest in [kMinSketchK, kBreadthSketchK] that fits for all, else kBreadthSketchK.
  int64_t BreadthK() const {
    int64_t lo = kMinSketchK, hi = kBreadthSketchK;
    const bool uniform = BreadthCost(lo) <= left_;
    while (uniform && lo < hi) {  // largest k in [lo, hi] with BreadthCost(k) <= left_
      const int64_t mid = (lo + hi + 1) / 2;
      if (BreadthCost(mid) <= left_) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return uniform ? lo : kBreadthSketchK;
  }

  const Costs& costs_;
  const std::vector<size_t> order_;
  std::vector<Choice> choice_;
  double left_ = 0;
};

}  // namespace

Expected<std::vector<Choice>> PlanFidelity(const Costs& costs, const std::vector<std::string>& priority,
                                           const std::map<std::string, std::string>& differs, double budget) {
  Planner planner(costs, PriorityOrder(costs, priority));
  const double left = planner.StartAsStats(budget);
  if (left < 0) {
    return Status::InvalidArgument("the traces need about " + HumanBytes(budget - left) +
                                   " even as stats for every parameter, and about " +
                                   HumanBytes(std::max(budget, 0.0)) + " is left for them");
  }
  planner.Breadth();
  planner.Depth();
  return planner.Explained(differs);
}

}  // namespace gradtrace::pack
