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

}  // namespace

Expected<std::vector<Choice>> PlanFidelity(const Costs& costs, const std::vector<std::string>& priority,
                                           const std::map<std::string, std::string>& differs, double budget) {
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

  std::vector<Choice> choice(costs.params.size());
  double left = budget - static_cast<double>(costs.fixed_bytes);
  for (size_t i = 0; i < costs.params.size(); ++i) {
    const ParamCost& c = costs.params[i];
    choice[i].name = c.name;
    choice[i].mode.kind = c.full_slices == 0 ? CaptureMode::Kind::kFull : CaptureMode::Kind::kStats;
    choice[i].est_bytes = StatsBytes(c);
    left -= choice[i].est_bytes;
  }
  if (left < 0) {
    return Status::InvalidArgument("the traces need about " + HumanBytes(budget - left) +
                                   " even as stats for every parameter, and about " +
                                   HumanBytes(std::max(budget, 0.0)) + " is left for them");
  }
  // Tries to move parameter i to `mode` costing `bytes`; true when it fits.
  auto take = [&](size_t i, CaptureMode mode, double bytes) {
    const double extra = bytes - choice[i].est_bytes;
    if (extra > left) return false;
    left -= extra;
    choice[i].mode = mode;
    choice[i].est_bytes = bytes;
    return true;
  };
  const CaptureMode full{CaptureMode::Kind::kFull, 0};
  // Round 1, breadth: the largest K up to kBreadthSketchK that every
  // parameter can have at once (full where that is no dearer); when not even
  // kMinSketchK fits for all, parameters take it in priority order instead.
  auto breadth_cost = [&](int64_t k) {
    double extra = 0;
    for (size_t i : order) {
      const ParamCost& c = costs.params[i];
      if (c.full_slices == 0) continue;
      const int64_t ki = std::min<int64_t>(k, c.numel / 2);
      const double best = ki >= kMinSketchK ? std::min(c.full_bytes, SketchBytes(c, ki)) : c.full_bytes;
      if (best <= left + choice[i].est_bytes) extra += std::max(0.0, best - choice[i].est_bytes);
    }
    return extra;
  };
  int64_t lo = kMinSketchK, hi = kBreadthSketchK;
  const bool uniform = breadth_cost(lo) <= left;
  while (uniform && lo < hi) {  // largest k in [lo, hi] with breadth_cost(k) <= left
    const int64_t mid = (lo + hi + 1) / 2;
    if (breadth_cost(mid) <= left) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int64_t breadth_k = uniform ? lo : kBreadthSketchK;
  for (size_t i : order) {
    const ParamCost& c = costs.params[i];
    if (c.full_slices == 0) continue;
    const int64_t k = std::min<int64_t>(breadth_k, c.numel / 2);
    if ((k < kMinSketchK || c.full_bytes <= SketchBytes(c, k)) && take(i, full, c.full_bytes)) continue;
    if (k >= kMinSketchK) take(i, {CaptureMode::Kind::kSketch, static_cast<int32_t>(k)}, SketchBytes(c, k));
  }
  // Round 2, depth, in priority order: full if it fits, else the largest K.
  for (size_t i : order) {
    const ParamCost& c = costs.params[i];
    if (c.full_slices == 0 || choice[i].mode.kind == CaptureMode::Kind::kFull) continue;
    if (take(i, full, c.full_bytes)) continue;
    const int32_t k = LargestK(c, choice[i].est_bytes + left, c.numel / 2);
    if (k > choice[i].mode.k) take(i, {CaptureMode::Kind::kSketch, k}, SketchBytes(c, k));
  }
  for (size_t i = 0; i < choice.size(); ++i) {
    const ParamCost& c = costs.params[i];
    auto d = differs.find(c.name);
    const std::string status = d == differs.end() ? "matches" : "differs (" + d->second + ")";
    if (c.full_slices == 0) {
      choice[i].why = "captured as sketch or stats: kept";
    } else if (choice[i].mode.kind == CaptureMode::Kind::kFull) {
      choice[i].why = status + "; full fits (" + HumanBytes(c.full_bytes) + ")";
    } else {
      choice[i].why = status + "; full needs " + HumanBytes(c.full_bytes) + ", more than was left";
    }
  }
  // Table order: the priority order, so the README lists what differs first.
  std::vector<Choice> ordered;
  for (size_t i : order) ordered.push_back(choice[i]);
  return ordered;
}

}  // namespace gradtrace::pack
