#include "compare/stream_compare.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "slice_codec.h"

namespace gradtrace::diff {
namespace {

using Frames = std::vector<std::vector<const FrameRef*>>;

// One side: the frames holding the unit's parameters, per rank that holds any.
struct Plan {
  const TraceSet* set = nullptr;
  std::vector<int32_t> ids;  // the unit's parameters on this side, ascending
  std::vector<int> holders;  // ranks, ascending; holders[0]'s frames are decoded, the others' compared to them
  std::vector<std::vector<const FrameRef*>> lists;  // per holder, in file order
};

bool Holds(const FrameRef& f, const std::vector<int32_t>& ids) {
  for (int32_t id : f.param_ids) {
    if (std::binary_search(ids.begin(), ids.end(), id)) return true;
  }
  return false;
}

// Catalogue entries that copies of one frame share.
bool SameEntry(const FrameRef& a, const FrameRef& b) {
  return a.param_ids == b.param_ids && a.raw_bytes == b.raw_bytes && a.micro_step == b.micro_step &&
         a.bucket_id == b.bucket_id && a.group == b.group && a.bucket_numel == b.bucket_numel &&
         a.partition_offset == b.partition_offset && a.partition_count == b.partition_count;
}

// False when the catalogue already shows a layout the walk does not take.
bool MakePlan(const TraceSet& set, const Frames& frames, std::vector<int32_t> ids, Plan* plan) {
  plan->set = &set;
  std::sort(ids.begin(), ids.end());
  plan->ids = std::move(ids);
  for (size_t r = 0; r < frames.size(); ++r) {
    std::vector<const FrameRef*> list;
    for (const FrameRef* f : frames[r]) {
      if (Holds(*f, plan->ids)) list.push_back(f);
    }
    if (list.empty()) continue;
    plan->holders.push_back(static_cast<int>(r));
    plan->lists.push_back(std::move(list));
  }
  if (plan->holders.empty()) return false;
  const auto& first = plan->lists[0];
  for (const FrameRef* f : first) {
    if (f->micro_step != first[0]->micro_step) return false;  // micro-steps add up: reassembly sums them
  }
  for (size_t h = 1; h < plan->lists.size(); ++h) {
    const auto& list = plan->lists[h];
    if (list.size() != first.size()) return false;
    for (size_t i = 0; i < list.size(); ++i) {
      if (!SameEntry(*list[i], *first[i])) return false;
    }
  }
  return true;
}

// Walks one side's full slices of the unit's parameters, in file order, one
// decoded frame at a time.
class Cursor {
 public:
  Cursor(const Plan& plan, int side, ReaderCache* readers, StreamCache* cache)
      : plan_(plan), side_(side), readers_(readers), cache_(cache) {}
  ~Cursor() {
    if (slot_ != nullptr) cache_->Leave(slot_);
  }

  // The slice under the cursor (null at the end); false when the layout is not one the walk takes.
  bool Peek(const pb::Slice** out) {
    for (;;) {
      if (slot_ == nullptr) {
        if (frame_ >= plan_.lists[0].size()) {
          *out = nullptr;
          return true;
        }
        if (!Load()) return false;
        slice_ = 0;
        used_ = 0;
      }
      const auto& slices = slot_->view.record().slices();
      for (; slice_ < static_cast<size_t>(slices.size()); ++slice_, used_ = 0) {
        const pb::Slice& s = slices[static_cast<int>(slice_)];
        if (!std::binary_search(plan_.ids.begin(), plan_.ids.end(), s.param_id())) continue;
        if (!s.has_full()) return false;
        if (used_ < s.count()) {
          *out = &s;
          return true;
        }
      }
      ++frame_;
      cache_->Leave(slot_);
      slot_ = nullptr;
    }
  }
  int64_t used() const { return used_; }  // elements of the slice under the cursor already taken
  std::string_view data() const { return slot_->view.data(static_cast<int>(slice_)); }  // its bytes
  void Take(int64_t n) { used_ += n; }

 private:
  // Frame frame_ of the first holder, decoded (or kept from an earlier unit), and every other holder's copy of it
  // found the same record (TraceReader::SameRecord: byte-identical, or a reference naming byte-identical values).
  bool Load() {
    const FrameRef& f = *plan_.lists[0][frame_];
    const int rank = plan_.holders[0];
    auto reader = readers_->Get(*plan_.set, rank);
    if (!reader.ok()) return false;
    auto [slot, decoded] = cache_->Lookup(side_, *plan_.set, rank, f);
    // The first holder's stored bytes, read into the worker's buffer: needed to decode the frame, or to check a copy
    // not checked before. Slots keep only the decoded frame (half the memory, and so half the page faults).
    TraceReader::StoredFrame& stored = cache_->stored();
    bool have_stored = false;
    auto read_stored = [&] { return have_stored = (*reader)->ReadStoredAt(f.offset, &stored).ok(); };
    if (!decoded) {
      // Read and decoded in one pass; the stored bytes kept only when there are copies to compare with them.
      const bool copies = plan_.holders.size() > 1;
      slot->decoded = (*reader)->ReadView(f.offset, &slot->view, copies ? &stored : nullptr).ok();
      have_stored = copies && slot->decoded;
      if (!slot->decoded) {
        slot->set = nullptr;
        slot->units = UnitRange{};
        return false;
      }
    }
    slot_ = slot;
    for (size_t h = 1; h < plan_.holders.size(); ++h) {
      const std::pair<int, uint64_t> copy{plan_.holders[h], plan_.lists[h][frame_]->offset};
      if (std::find(slot->same.begin(), slot->same.end(), copy) != slot->same.end()) continue;
      if (!have_stored && !read_stored()) return false;
      auto copy_reader = readers_->Get(*plan_.set, copy.first);
      TraceReader::StoredFrame& other = cache_->other();
      const uint64_t from = slot->view.record().values_from();  // format 1.6: a reference
      if (!copy_reader.ok() || !(*copy_reader)->ReadStoredAt(copy.second, &other).ok() ||
          !TraceReader::SameRecord(**reader, stored, from, **copy_reader, other)) {
        return false;
      }
      slot->same.push_back(copy);
    }
    return true;
  }

  const Plan& plan_;
  int side_;
  ReaderCache* readers_;
  StreamCache* cache_;
  StreamCache::Slot* slot_ = nullptr;  // frame_'s, once loaded
  size_t frame_ = 0;
  size_t slice_ = 0;
  int64_t used_ = 0;
};

// Elements [lo, lo + n) of parameter `id` from the cursor into buf: the next
// elements of its slices, which must continue exactly there.
template <typename T>
bool Fill(Cursor* c, int32_t id, int64_t numel, int64_t lo, int64_t n, T* buf) {
  for (int64_t done = 0; done < n;) {
    const pb::Slice* s = nullptr;
    if (!c->Peek(&s) || s == nullptr || s->param_id() != id) return false;
    if (s->offset() < 0 || s->count() > numel - s->offset() || s->offset() + c->used() != lo + done) return false;
    const int64_t take = std::min(n - done, s->count() - c->used());
    if (!CopyFullValueRange(*s, c->data(), c->used(), take, buf + done).ok()) return false;
    c->Take(take);
    done += take;
  }
  return true;
}

SideSummary Summary(const Plan& plan, int64_t numel, double norm) {
  SideSummary s;
  s.numel = numel;
  s.ranks = static_cast<int>(plan.holders.size());
  s.has_full = true;
  s.covered = numel;
  s.replica_ref2 = static_cast<double>(plan.holders.size() - 1) * norm * norm;  // copies agree: no difference
  s.replica_rank = plan.holders[0];
  return s;
}

// Element buffers of one block per side: float for values of at most 32 bits, double for fp64.
struct Buffers {
  std::vector<float> f32;
  std::vector<double> f64;
  template <typename F>
  decltype(auto) With(bool wide, F&& f) {
    if (wide) {
      f64.resize(FullSums::kBlock);
      return f(f64.data());
    }
    f32.resize(FullSums::kBlock);
    return f(f32.data());
  }
};

}  // namespace

void StreamCache::BeginUnit(size_t unit) { walk_.Begin(static_cast<int>(unit)); }

void StreamCache::Leave(Slot* slot) const {
  if (!walk_.Later(slot->units)) slot->units = UnitRange{};
}

std::pair<StreamCache::Slot*, bool> StreamCache::Lookup(int side, const TraceSet& set, int rank, const FrameRef& f) {
  Slot* free = nullptr;
  uint64_t kept = 0;
  for (auto& slot : slots_[side]) {
    const bool live = walk_.Live(slot->units);
    if (live && slot->set == &set && slot->rank == rank && slot->offset == f.offset && slot->decoded) {
      return {slot.get(), true};
    }
    if (!live && free == nullptr) free = slot.get();
    if (live) kept += slot->view.held_bytes();
  }
  if (free == nullptr) free = slots_[side].emplace_back(std::make_unique<Slot>()).get();
  const auto plan = plans_.find(&set);
  const UnitRange units = plan == plans_.end() ? UnitRange{} : UnitsOf(plan->second, f);
  const uint64_t bytes = f.raw_bytes;
  free->set = &set;
  free->rank = rank;
  free->offset = f.offset;
  free->same.clear();
  free->decoded = false;
  // Kept for a later unit within the budget; otherwise free again once the cursor is past it.
  const int here = walk_.unit();
  free->units = walk_.Later(units) && kept + bytes <= budget_ / 2 ? units : UnitRange{here, here};
  return {free, false};
}

bool CompareStreamed(const TraceSet& x, const TraceSet& y, const Frames& frames_x, const Frames& frames_y,
                     const Alignment& al, const std::vector<size_t>& pairs, ReaderCache* readers, StreamCache* cache,
                     std::vector<StreamedParam>* out) {
  std::vector<int32_t> ids_x, ids_y;
  std::unordered_map<int32_t, size_t> slot_of;  // A's parameter id -> k
  for (size_t k = 0; k < pairs.size(); ++k) {
    const ParamPair& p = al.params[pairs[k]];
    if (p.id_a < 0 || p.id_b < 0 || p.numel <= 0 || !p.problem.empty()) return false;
    if (x.run().params(p.id_a).numel() != p.numel || y.run().params(p.id_b).numel() != p.numel) return false;
    if (!slot_of.emplace(p.id_a, k).second) return false;
    ids_x.push_back(p.id_a);
    ids_y.push_back(p.id_b);
  }
  Plan px, py;
  if (pairs.empty() || !MakePlan(x, frames_x, ids_x, &px) || !MakePlan(y, frames_y, ids_y, &py)) return false;
  Cursor cx(px, 0, readers, cache), cy(py, 1, readers, cache);
  static thread_local Buffers buf_x, buf_y;
  std::vector<StreamedParam> results(pairs.size());
  std::vector<char> done(pairs.size(), 0);
  for (;;) {
    const pb::Slice* s = nullptr;
    if (!cx.Peek(&s)) return false;
    if (s == nullptr) break;
    const auto it = slot_of.find(s->param_id());
    if (it == slot_of.end() || done[it->second] || s->offset() + cx.used() != 0) return false;
    const size_t k = it->second;
    const ParamPair& p = al.params[pairs[k]];
    const bool wide_x = x.run().params(p.id_a).dtype() == pb::FP64, wide_y = y.run().params(p.id_b).dtype() == pb::FP64;
    FullSums sums;
    const bool walked = buf_x.With(wide_x, [&](auto* bx) {
      return buf_y.With(wide_y, [&](auto* by) {
        for (int64_t lo = 0; lo < p.numel; lo += FullSums::kBlock) {
          const int64_t n = std::min(FullSums::kBlock, p.numel - lo);
          if (!Fill(&cx, p.id_a, p.numel, lo, n, bx) || !Fill(&cy, p.id_b, p.numel, lo, n, by)) return false;
          sums.Add(bx, by, n, lo + n == p.numel);
        }
        return true;
      });
    });
    if (!walked) return false;
    StreamedParam& r = results[k];
    r.metrics = sums.Finish(Basis::kFull);
    // Non-finite values on a side with copies: the replica merge decides what they mean.
    const bool odd_x = r.metrics.nonfinite_a > 0 || !std::isfinite(r.metrics.norm_a);
    const bool odd_y = r.metrics.nonfinite_b > 0 || !std::isfinite(r.metrics.norm_b);
    if ((odd_x && px.holders.size() > 1) || (odd_y && py.holders.size() > 1)) return false;
    r.a = Summary(px, p.numel, r.metrics.norm_a);
    r.b = Summary(py, p.numel, r.metrics.norm_b);
    done[k] = 1;
  }
  const pb::Slice* rest = nullptr;
  if (!cy.Peek(&rest) || rest != nullptr) return false;  // B holds more of the unit than A did
  if (std::find(done.begin(), done.end(), 0) != done.end()) return false;
  *out = std::move(results);
  return true;
}

}  // namespace gradtrace::diff
