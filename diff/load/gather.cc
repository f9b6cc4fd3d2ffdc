#include "load/gather.h"

#include <algorithm>
#include <cmath>

#include "slice_codec.h"

namespace gradtrace::diff {

Status AddSlice(const pb::Slice& slice, int64_t numel, SideValues* v) {
  v->numel = numel;
  if (slice.offset() < 0 || slice.count() < 0 || slice.offset() > numel || slice.count() > numel - slice.offset()) {
    return Status::Corruption("slice [" + std::to_string(slice.offset()) + ", +" + std::to_string(slice.count()) +
                              ") outside parameter of " + std::to_string(numel) + " elements");
  }
  switch (slice.payload_case()) {
    case pb::Slice::kFull: {
      if (v->narrow && slice.dtype() == pb::FP64) v->Widen();
      if (!v->has_full()) {
        v->WithDense([numel](auto& dense) { dense.assign(numel, 0); });
        v->filled.assign(numel, 0);
      }
      GT_RETURN_IF_ERROR(
          v->WithDense([&](auto& dense) { return AddFullValues(slice, dense.data() + slice.offset()); }));
      uint8_t* filled = v->filled.data() + slice.offset();
      int64_t fresh = 0;
      for (int64_t i = 0; i < slice.count(); ++i) {
        fresh += 1 - filled[i];
        filled[i] = 1;
      }
      v->covered += fresh;
      return Status::Ok();
    }
    case pb::Slice::kSketch: {
      const auto& sk = slice.sketch();
      if (sk.positions_size() != sk.values_size()) {
        return Status::Corruption("sketch has " + std::to_string(sk.positions_size()) + " positions but " +
                                  std::to_string(sk.values_size()) + " values");
      }
      for (int i = 0; i < sk.positions_size(); ++i) {
        int64_t pos = sk.positions(i);
        if (pos < 0 || pos >= numel)
          return Status::Corruption("sketch position " + std::to_string(pos) + " out of range");
        v->sparse[pos] += sk.values(i);
      }
      return Status::Ok();
    }
    case pb::Slice::kStats: {
      const auto& st = slice.stats();
      // Two stats slices at one offset are micro-steps: their moments add only as sums.
      if (!v->stats_offsets.insert(slice.offset()).second) v->stats_sums_only = true;
      Moments m;
      m.count = st.count();
      m.sum = st.sum();
      m.sum_sq = st.sum_sq();
      m.abs_max = st.abs_max();
      m.nonfinite = st.nonfinite();
      v->moments.Merge(m);
      v->has_stats = true;
      return Status::Ok();
    }
    default:
      return Status::Corruption("slice without payload");
  }
}

void SideValues::Widen() {
  if (!narrow) return;
  narrow = false;
  dense.assign(dense32.begin(), dense32.end());
  dense32 = {};
}

namespace {

// Full values of one rank into the side's (same storage type): fills, sums or compares.
template <typename T>
void MergeDense(int rank, const std::vector<T>& in, const std::vector<uint8_t>& in_filled, int64_t numel,
                Combine combine, std::vector<T>* dense, SideValues* side) {
  if (dense->empty()) {
    dense->assign(numel, T{0});
    side->filled.assign(numel, 0);
  }
  double d2 = 0, ref2 = 0;
  for (int64_t e = 0; e < numel; ++e) {
    if (!in_filled[e]) continue;
    if (!side->filled[e]) {
      side->filled[e] = 1;
      (*dense)[e] = in[e];
      ++side->covered;
    } else if (combine == Combine::kSum) {
      (*dense)[e] += in[e];
    } else {
      double diff = static_cast<double>(in[e]) - static_cast<double>((*dense)[e]);
      const double ref = static_cast<double>((*dense)[e]);
      d2 += diff * diff;
      ref2 += ref * ref;
      side->replica_max_abs = std::max(side->replica_max_abs, std::fabs(diff));
      ++side->replica_elems;
    }
  }
  if (combine == Combine::kReplicas && ref2 + d2 > 0) {
    side->replica_diff2 += d2;
    side->replica_ref2 += ref2;
    double rel = ref2 > 0 ? std::sqrt(d2 / ref2) : 1.0;
    if (rel > side->replica_worst) {
      side->replica_worst = rel;
      side->replica_other = rank;
    }
  }
}

}  // namespace

void MergeRank(int rank, int first_rank, SideValues&& r, Combine combine, SideValues* side) {
  side->numel = r.numel;
  side->ranks += 1;
  if (side->ranks == 1) {
    // First contributor: take its values as they are.
    int64_t n = r.numel;
    *side = std::move(r);
    side->numel = n;
    side->ranks = 1;
    (void)first_rank;
    side->replica_rank = rank;
    return;
  }
  if (r.has_full()) {
    // One storage type for both: a side without full values takes r's.
    if (!side->has_full()) {
      side->narrow = r.narrow;
    } else if (r.narrow != side->narrow) {
      r.Widen();
      side->Widen();
    }
    if (side->narrow) {
      MergeDense(rank, r.dense32, r.filled, r.numel, combine, &side->dense32, side);
    } else {
      MergeDense(rank, r.dense, r.filled, r.numel, combine, &side->dense, side);
    }
  }
  for (const auto& [pos, val] : r.sparse) {
    auto [it, inserted] = side->sparse.emplace(pos, val);
    if (inserted) continue;
    if (combine == Combine::kSum) {
      it->second += val;
    } else {
      double diff = val - it->second;
      side->replica_diff2 += diff * diff;
      side->replica_ref2 += it->second * it->second;
      side->replica_max_abs = std::max(side->replica_max_abs, std::fabs(diff));
      ++side->replica_elems;
      double rel = it->second != 0 ? std::fabs(diff / it->second) : (diff != 0 ? 1.0 : 0.0);
      if (rel > side->replica_worst) {
        side->replica_worst = rel;
        side->replica_other = rank;
      }
    }
  }
  if (r.has_stats) {
    if (combine == Combine::kSum) {
      side->moments.Merge(r.moments);
      side->stats_sums_only = true;
    } else if (!side->has_stats) {
      side->moments = r.moments;
    } else if (r.moments.count + side->moments.count <= r.numel) {
      side->moments.Merge(r.moments);  // disjoint partitions of one gradient
    }
    // Overlapping stats replicas: keep the first; moments cannot locate the overlap.
    side->has_stats = true;
    side->stats_sums_only = side->stats_sums_only || r.stats_sums_only;
  }
}

Expected<TraceReader*> ReaderCache::Get(const TraceSet& set, int rank) {
  auto key = std::make_pair(&set, rank);
  auto it = readers_.find(key);
  if (it != readers_.end()) return it->second.get();
  const std::string& path = set.ranks()[rank].path;
  auto opened = TraceReader::Open(set.ranks()[rank].source);
  if (!opened.ok()) return Status::IoError(NameFile(path, opened.status().message()));
  TraceReader* r = opened->get();
  readers_.emplace(key, std::move(*opened));
  return r;
}

std::vector<std::vector<const FrameRef*>> SelectFrames(const TraceSet& set, const Selection& sel) {
  std::vector<std::vector<const FrameRef*>> out(set.world());
  for (const FrameRef& f : set.frames()) {
    if (f.step == sel.step && f.phase == sel.phase) out[f.rank].push_back(&f);
  }
  return out;
}

Status GatherParams(const TraceSet& set, const std::vector<std::vector<const FrameRef*>>& frames,
                    const std::vector<int32_t>& ids, Combine combine, ReaderCache* readers,
                    std::vector<SideValues>* out) {
  out->assign(ids.size(), SideValues());
  std::unordered_map<int32_t, size_t> slot;
  for (size_t i = 0; i < ids.size(); ++i) slot[ids[i]] = i;
  const auto& table = set.run().params();
  for (int rank = 0; rank < set.world(); ++rank) {
    std::vector<SideValues> mine(ids.size());
    std::vector<uint8_t> touched(ids.size(), 0);
    for (size_t i = 0; i < ids.size(); ++i) {
      // Float storage only where values are copied (replicas) and exact in float.
      mine[i].narrow = combine == Combine::kReplicas && table[ids[i]].dtype() != pb::FP64;
    }
    for (const FrameRef* f : frames[rank]) {
      bool wanted = std::any_of(f->param_ids.begin(), f->param_ids.end(), [&](int32_t id) { return slot.count(id); });
      if (!wanted) continue;
      auto reader = readers->Get(set, rank);
      if (!reader.ok()) return reader.status();
      Frame frame;
      Status st = (*reader)->ReadAt(f->offset, &frame);
      if (!st.ok()) return Status::Corruption(NameFile(set.ranks()[rank].path, st.message()));
      if (!frame.bucket) {
        return Status::Corruption(set.ranks()[rank].path + ": frame at offset " + std::to_string(f->offset) +
                                  " is no longer a bucket record");
      }
      for (const pb::Slice& s : frame.bucket->slices()) {
        auto it = slot.find(s.param_id());
        if (it == slot.end()) continue;
        Status added = AddSlice(s, table[s.param_id()].numel(), &mine[it->second]);
        if (!added.ok()) {
          return Status::Corruption(set.ranks()[rank].path + ": frame at offset " + std::to_string(f->offset) +
                                    ", parameter '" + table[s.param_id()].name() + "': " + added.message());
        }
        touched[it->second] = 1;
      }
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      if (touched[i]) MergeRank(rank, 0, std::move(mine[i]), combine, &(*out)[i]);
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) (*out)[i].numel = table[ids[i]].numel();
  return Status::Ok();
}

}  // namespace gradtrace::diff
