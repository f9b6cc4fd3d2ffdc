#include "load/gather.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string_view>

#include "frame_io.h"
#include "sketch.h"
#include "slice_codec.h"
#include "values_from.h"

namespace gradtrace::diff {

Status AddSlice(const pb::Slice& slice, int64_t numel, SideValues* v) {
  return AddSlice(slice, slice.full().data(), numel, v);
}

Status AddSlice(const pb::Slice& slice, std::string_view data, int64_t numel, SideValues* v) {
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
          v->WithDense([&](auto& dense) { return AddFullValues(slice, data, dense.data() + slice.offset()); }));
      if (slice.count() == 0) return Status::Ok();  // a zero-element parameter has no buffer to mark
      uint8_t* filled = v->filled.data() + slice.offset();
      if (std::memchr(filled, 1, slice.count()) == nullptr) {
        std::memset(filled, 1, slice.count());  // the usual case: slices do not overlap
        v->covered += slice.count();
      } else {
        int64_t fresh = 0;
        for (int64_t i = 0; i < slice.count(); ++i) {
          fresh += 1 - filled[i];
          filled[i] = 1;
        }
        v->covered += fresh;
      }
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

// Sum of squares in kSumLanes interleaved chains (SIMD, fixed order).
template <typename T>
double SquaredNorm(const T* x, int64_t n) {
  double l[kSumLanes] = {};
  const int64_t full = n - n % kSumLanes;
  for (int64_t i = 0; i < full; i += kSumLanes) {
    for (int k = 0; k < kSumLanes; ++k) l[k] += static_cast<double>(x[i + k]) * static_cast<double>(x[i + k]);
  }
  for (int64_t i = full; i < n; ++i) l[i - full] += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return LaneSum(l);
}

// Records one rank's disagreement with the side's values (replicas).
void NoteReplica(int rank, double d2, double ref2, SideValues* side) {
  if (ref2 + d2 > 0) {
    side->replica_diff2 += d2;
    side->replica_ref2 += ref2;
    double rel = ref2 > 0 ? std::sqrt(d2 / ref2) : 1.0;
    if (rel > side->replica_worst) {
      side->replica_worst = rel;
      side->replica_other = rank;
    }
  }
}

// MergeDense where both the side and the rank hold every element (the usual
// FINAL/POST case): no per-element branch. A replica that is bitwise the side's
// values (what an all-reduce gives every rank) costs one memcmp; the side's
// squared norm, which every such comparison adds, is computed once.
template <typename T>
void MergeComplete(int rank, const std::vector<T>& in, Combine combine, std::vector<T>* dense, SideValues* side) {
  const int64_t n = static_cast<int64_t>(in.size());
  T* d = dense->data();
  const T* x = in.data();
  if (combine == Combine::kSum) {
    for (int64_t e = 0; e < n; ++e) d[e] += x[e];
    side->ref_norm2 = -1;
    return;
  }
  side->replica_elems += n;
  if (side->ref_norm2 < 0) side->ref_norm2 = SquaredNorm(d, n);
  if (std::isfinite(side->ref_norm2) && std::memcmp(d, x, n * sizeof(T)) == 0) {
    NoteReplica(rank, 0, side->ref_norm2, side);
    return;
  }
  double d2_l[kSumLanes] = {}, max_l[kSumLanes] = {};
  auto one = [&](int64_t e, int k) {
    const double diff = static_cast<double>(x[e]) - static_cast<double>(d[e]);
    d2_l[k] += diff * diff;
    max_l[k] = std::max(max_l[k], std::fabs(diff));  // NaN never wins, as in MergeDense
  };
  const int64_t full = n - n % kSumLanes;
  for (int64_t e = 0; e < full; e += kSumLanes) {
    for (int k = 0; k < kSumLanes; ++k) one(e + k, k);
  }
  for (int64_t e = full; e < n; ++e) one(e, static_cast<int>(e - full));
  side->replica_max_abs = std::max(side->replica_max_abs, *std::max_element(max_l, max_l + kSumLanes));
  NoteReplica(rank, LaneSum(d2_l), side->ref_norm2, side);
}

// Full values of one rank into the side's (same storage type): fills, sums or compares.
template <typename T>
void MergeDense(int rank, const std::vector<T>& in, const std::vector<uint8_t>& in_filled, int64_t in_covered,
                int64_t numel, Combine combine, std::vector<T>* dense, SideValues* side) {
  if (!dense->empty() && side->covered == numel && in_covered == numel && static_cast<int64_t>(in.size()) == numel) {
    MergeComplete(rank, in, combine, dense, side);
    return;
  }
  side->ref_norm2 = -1;
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
  if (combine == Combine::kReplicas) NoteReplica(rank, d2, ref2, side);
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
      MergeDense(rank, r.dense32, r.filled, r.covered, r.numel, combine, &side->dense32, side);
    } else {
      MergeDense(rank, r.dense, r.filled, r.covered, r.numel, combine, &side->dense, side);
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

UnitRange UnitsOf(const std::vector<int>& unit_of_param, const FrameRef& f) {
  UnitRange r;
  for (int32_t id : f.param_ids) {
    if (id < 0 || static_cast<size_t>(id) >= unit_of_param.size() || unit_of_param[id] < 0) continue;
    const int u = unit_of_param[id];
    r.first = r.first < 0 ? u : std::min(r.first, u);
    r.last = std::max(r.last, u);
  }
  return r;
}

Expected<TraceReader*> ReaderCache::Get(const TraceSet& set, int rank) {
  auto key = std::make_pair(&set, rank);
  auto it = readers_.find(key);
  if (it != readers_.end()) return it->second.get();
  const std::string& path = set.ranks()[rank].path;
  ReadOptions options;
  options.table = set.table();  // one table for the set's readers, not one per rank (issue 42)
  auto opened = TraceReader::Open(set.ranks()[rank].source, options);
  if (!opened.ok()) return Status::IoError(NameFile(path, opened.status().message()));
  TraceReader* r = opened->get();
  readers_.emplace(key, std::move(*opened));
  return r;
}

void ReaderCache::Plan(const TraceSet& set, std::vector<int> unit_of_param) { plans_[&set] = std::move(unit_of_param); }

size_t ReaderCache::PositionHash::operator()(const Position& p) const {
  uint64_t h = reinterpret_cast<uintptr_t>(p.set) * 0x9e3779b97f4a7c15ull;
  h ^= (static_cast<uint64_t>(static_cast<uint32_t>(p.rank)) + 0x7f4a7c15ull + (h << 6) + (h >> 2));
  h ^= (p.offset + 0x9e3779b9ull + (h << 6) + (h >> 2));
  return static_cast<size_t>(h);
}

uint64_t ReaderCache::ContentKey(const TraceSet& set, const TraceReader::StoredFrame& stored) {
  const std::string_view header(reinterpret_cast<const char*>(stored.header), sizeof stored.header);
  return sketch::Fnv1a64(header, sketch::kFnvOffset ^ reinterpret_cast<uintptr_t>(&set));
}

uint64_t ReaderCache::ReferenceKey(const TraceSet& set, const pb::BucketRecord& ref) {
  return sketch::Fnv1a64(WithoutValuesFrom(ref), sketch::kFnvOffset ^ ~reinterpret_cast<uintptr_t>(&set));
}

void ReaderCache::Drop(KeptList::iterator it) {
  for (const Position& p : it->at) by_position_.erase(p);
  for (auto [c, end] = by_content_.equal_range(it->content); c != end; ++c) {
    if (c->second == &*it) {
      by_content_.erase(c);
      break;
    }
  }
  kept_bytes_ -= it->bytes;
  if (it->units.last >= 0) --planned_;
  kept_.erase(it);
}

void ReaderCache::BeginUnit(size_t unit) {
  walk_.Begin(static_cast<int>(unit));
  if (planned_ == 0) return;
  for (auto it = kept_.begin(); it != kept_.end();) {
    auto here = it++;
    if (here->units.last >= 0 && !walk_.Live(here->units)) Drop(here);
  }
}

void ReaderCache::SetDone(const TraceSet& set) {
  if (planned_ == 0) return;
  for (auto it = kept_.begin(); it != kept_.end();) {
    auto here = it++;
    if (here->set == &set && here->units.last >= 0 && !walk_.Later(here->units)) Drop(here);
  }
}

Expected<const RecordView*> ReaderCache::Bucket(const TraceSet& set, const FrameRef& f, bool replicas) {
  const Position at{&set, f.rank, f.offset};
  if (auto hit = by_position_.find(at); hit != by_position_.end()) return hit->second->frame.get();
  auto reader = Get(set, f.rank);
  if (!reader.ok()) return reader.status();
  const std::string& path = set.ranks()[f.rank].path;
  if (!scratch_) scratch_ = std::make_unique<RecordView>();
  TraceReader::StoredFrame& stored = scratch_stored_;
  // Only replicas have copies to find by their bytes (and only a cache that keeps frames finds them); any other
  // frame is read and decoded in one pass.
  const bool copies = replicas && set.world() > 1 && frame_budget_ > 0;
  uint64_t content = 0;
  bool by_reference = false;  // content is ReferenceKey's (the frame parsed as a reference already)
  if (copies) {
    if (Status st = (*reader)->ReadStoredAt(f.offset, &stored); !st.ok()) {
      return Status::Corruption(NameFile(path, st.message()));
    }
    // The same header (its CRC included) and bytes as a frame decoded before: the same record. References
    // (format 1.6) are found by what they name instead, once the cache has met one: the bytes of replicas'
    // references differ where their targets are.
    content = ContentKey(set, stored);
    if (references_ && frame_io::FrameHeader::Decode(stored.header).raw_len <= kReferenceParseLimit &&
        (*reader)->ParseStored(stored, &reference_).ok() && reference_.values_from() != 0) {
      content = ReferenceKey(set, reference_);
      by_reference = true;
    }
    for (auto [c, end] = by_content_.equal_range(content); c != end; ++c) {
      Kept& k = *c->second;
      if (k.set != &set) continue;
      auto kept_reader = Get(set, k.at.front().rank);
      if (!kept_reader.ok() ||
          !TraceReader::SameRecord(**kept_reader, k.stored, k.frame->record().values_from(), **reader, stored)) {
        continue;
      }
      k.at.push_back(at);
      by_position_.emplace(at, &k);
      ++deduplicated_;
      return k.frame.get();
    }
  }
  Status st =
      copies ? (*reader)->DecodeStoredView(stored, scratch_.get()) : (*reader)->ReadView(f.offset, scratch_.get());
  ++decoded_;
  if (!st.ok()) return Status::Corruption(NameFile(path, st.message()));
  const auto plan = plans_.find(&set);
  const UnitRange units = plan == plans_.end() ? UnitRange{} : UnitsOf(plan->second, f);
  // Kept while the budget allows: nothing is evicted for it, the frames kept
  // are this unit's (for its other ranks) and those ahead of its cuts.
  // Worth keeping: a later unit reads it, or another rank may hold a replica of it. Frames that are neither are
  // decoded into the same buffers again (fresh ones cost page faults).
  const bool later = walk_.Later(units) || (units.last < 0 && plans_.count(&set) == 0);
  const bool worth = (later || (replicas && set.world() > 1)) && frame_budget_ > 0;
  const uint64_t bytes = worth ? scratch_->held_bytes() + (copies ? stored.bytes.size() : 0) : 0;
  if (worth && kept_bytes_ + bytes <= frame_budget_) {
    kept_bytes_ += bytes;
    Kept& k = kept_.emplace_back();
    k.set = &set;
    k.at.push_back(at);
    k.frame = std::move(scratch_);
    k.units = units;
    if (units.last >= 0) ++planned_;
    k.bytes = bytes;
    by_position_.emplace(at, &k);
    if (copies) {  // found by its bytes too, or a reference by what it names
      if (!by_reference && k.frame->record().values_from() != 0 && (*reader)->ParseStored(stored, &reference_).ok()) {
        references_ = true;
        content = ReferenceKey(set, reference_);
      }
      k.content = content;
      k.stored.offset = stored.offset;
      std::memcpy(k.stored.header, stored.header, sizeof stored.header);
      k.stored.bytes.swap(stored.bytes);
      by_content_.emplace(content, &k);
    }
    return k.frame.get();
  }
  return scratch_.get();
}

std::vector<std::vector<const FrameRef*>> SelectFrames(const TraceSet& set, const Selection& sel) {
  std::vector<std::vector<const FrameRef*>> out(set.world());
  for (const FrameRef& f : set.frames()) {
    if (f.step == sel.step && f.phase == sel.phase) out[f.rank].push_back(&f);
  }
  return out;
}

namespace {

// GatherParams over the ranks `rank_at(k)`, k < n, ascending, whose frames are `frames_at(k)`.
template <typename RankAt, typename FramesAt>
Status GatherRanks(const TraceSet& set, size_t n, RankAt rank_at, FramesAt frames_at, const std::vector<int32_t>& ids,
                   Combine combine, ReaderCache* readers, std::vector<SideValues>* out) {
  out->assign(ids.size(), SideValues());
  std::unordered_map<int32_t, size_t> slot;
  for (size_t i = 0; i < ids.size(); ++i) slot[ids[i]] = i;
  const auto& table = set.run().params();
  for (size_t k = 0; k < n; ++k) {
    const int rank = rank_at(k);
    const std::vector<const FrameRef*>& frames = frames_at(k);
    if (frames.empty()) continue;
    std::vector<SideValues> mine(ids.size());
    std::vector<uint8_t> touched(ids.size(), 0);
    for (size_t i = 0; i < ids.size(); ++i) {
      // Float storage only where values are copied (replicas) and exact in float.
      mine[i].narrow = combine == Combine::kReplicas && table[ids[i]].dtype() != pb::FP64;
    }
    for (const FrameRef* f : frames) {
      bool wanted = std::any_of(f->param_ids.begin(), f->param_ids.end(), [&](int32_t id) { return slot.count(id); });
      if (!wanted) continue;
      auto frame = readers->Bucket(set, *f, combine == Combine::kReplicas);
      if (!frame.ok()) return frame.status();
      const auto& slices = (*frame)->record().slices();
      for (int i = 0; i < slices.size(); ++i) {
        const pb::Slice& s = slices[i];
        auto it = slot.find(s.param_id());
        if (it == slot.end()) continue;
        Status added = AddSlice(s, (*frame)->data(i), table[s.param_id()].numel(), &mine[it->second]);
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
  readers->SetDone(set);
  return Status::Ok();
}

}  // namespace

Status GatherParams(const TraceSet& set, const std::vector<std::vector<const FrameRef*>>& frames,
                    const std::vector<int32_t>& ids, Combine combine, ReaderCache* readers,
                    std::vector<SideValues>* out) {
  return GatherRanks(
      set, std::min(frames.size(), static_cast<size_t>(set.world())), [](size_t k) { return static_cast<int>(k); },
      [&](size_t k) -> const std::vector<const FrameRef*>& { return frames[k]; }, ids, combine, readers, out);
}

Status GatherParams(const TraceSet& set, const FramesOfRanks& frames, const std::vector<int32_t>& ids, Combine combine,
                    ReaderCache* readers, std::vector<SideValues>* out) {
  return GatherRanks(
      set, frames.size(), [&](size_t k) { return frames[k].first; },
      [&](size_t k) -> const std::vector<const FrameRef*>& { return frames[k].second; }, ids, combine, readers, out);
}

}  // namespace gradtrace::diff
