#include "load/window_gather.h"

#include <algorithm>
#include <type_traits>

#include "slice_codec.h"

namespace gradtrace::diff {
namespace {

bool InParameter(const pb::Slice& s, int64_t numel) {
  return s.offset() >= 0 && s.count() >= 0 && s.offset() <= numel && s.count() <= numel - s.offset();
}

// Sorts `ranges` and joins the overlapping ones (a rank's micro-steps hold the same elements).
void Join(std::vector<std::pair<int64_t, int64_t>>* ranges) {
  std::sort(ranges->begin(), ranges->end());
  size_t out = 0;
  for (const auto& r : *ranges) {
    if (out > 0 && r.first <= (*ranges)[out - 1].second) {
      (*ranges)[out - 1].second = std::max((*ranges)[out - 1].second, r.second);
    } else {
      (*ranges)[out++] = r;
    }
  }
  ranges->resize(out);
}

}  // namespace

void WindowValues::Reset(int64_t lo, int64_t n) {
  lo_ = lo;
  n_ = n;
  covered_ = 0;
  if (static_cast<int64_t>(stamp_.size()) < n) {
    stamp_.resize(n, 0);
    WithValues([n](auto& v) { v.resize(n); });
  }
  if (++epoch_ == 0) {  // wrapped: every stamp could equal the new epoch
    std::fill(stamp_.begin(), stamp_.end(), 0);
    epoch_ = 1;
  }
}

int64_t WindowValues::Claim(int64_t begin, int64_t end) {
  int64_t fresh = 0;
  WithValues([&](auto& v) {
    for (int64_t i = begin; i < end; ++i) {
      if (stamp_[i] == epoch_) continue;
      stamp_[i] = epoch_;
      v[i] = 0;
      ++fresh;
    }
  });
  covered_ += fresh;
  return fresh;
}

WindowGather::WindowGather(const TraceSet& set, const std::vector<std::vector<const FrameRef*>>& frames, int32_t id,
                           Combine combine, bool narrow, ReaderCache* readers, uint64_t keep_budget)
    : set_(set),
      id_(id),
      numel_(set.run().params(id).numel()),
      combine_(combine),
      readers_(readers),
      keep_budget_(keep_budget),
      rank_values_(narrow) {
  for (const auto& per_rank : frames) {
    std::map<std::tuple<int32_t, int32_t, std::string>, size_t> record_of;  // (micro-step, bucket, group)
    for (const FrameRef* f : per_rank) {
      if (!std::binary_search(f->param_ids.begin(), f->param_ids.end(), id)) continue;
      auto [it, fresh] = record_of.try_emplace({f->micro_step, f->bucket_id, f->group}, cursors_.size());
      if (fresh) {
        cursors_.emplace_back();
        cursors_.back().rank = f->rank;
      }
      cursors_[it->second].frames.push_back(f);
    }
  }
}

Status WindowGather::Error(const Cursor& c, const std::string& what) const {
  const uint64_t offset = c.next < c.frames.size() ? c.frames[c.next]->offset : 0;
  return Status::Corruption(set_.ranks()[c.rank].path + ": frame at offset " + std::to_string(offset) +
                            ", parameter '" + set_.run().params(id_).name() + "': " + what);
}

Status WindowGather::Start() {
  kept_bytes_ = 0;
  waiting_ = {};
  for (size_t i = 0; i < cursors_.size(); ++i) {
    Cursor& c = cursors_[i];
    c.next = 0;
    c.slice = 0;
    c.resume = -1;
    c.decodes = 0;
    c.kept.reset();
    GT_RETURN_IF_ERROR(Advance(&c, 0, 0, nullptr, nullptr));  // an empty window: stops at the first full data
    Wait(i);
  }
  return Status::Ok();
}

void WindowGather::Wait(size_t index) {
  const Cursor& c = cursors_[index];
  if (c.next < c.frames.size()) waiting_.emplace(c.resume, index);
}

int64_t WindowGather::NextData() const { return waiting_.empty() ? kNone : waiting_.top().first; }

Status WindowGather::Gather(int64_t lo, int64_t hi, bool record, WindowValues* out) {
  out->Reset(lo, hi - lo);
  active_.clear();
  for (; !waiting_.empty() && waiting_.top().first < hi; waiting_.pop()) active_.push_back(waiting_.top().second);
  std::sort(active_.begin(), active_.end());  // rank order, as MergeRank merges
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (size_t k = 0; k < active_.size();) {
    const int rank = cursors_[active_[k]].rank;
    // The first rank with data here goes straight into `out`; later ones merge into it.
    const bool direct = out->covered() == 0;
    WindowValues* target = direct ? out : &rank_values_;
    if (!direct) rank_values_.Reset(lo, hi - lo);
    ranges.clear();
    for (; k < active_.size() && cursors_[active_[k]].rank == rank; ++k) {
      GT_RETURN_IF_ERROR(Advance(&cursors_[active_[k]], lo, hi, target, &ranges));
      Wait(active_[k]);
    }
    if (!direct && !ranges.empty()) MergeInto(rank, &ranges, record, out);
  }
  if (record) covered_ += out->covered();
  return Status::Ok();
}

Status WindowGather::Advance(Cursor* c, int64_t lo, int64_t hi, WindowValues* out,
                             std::vector<std::pair<int64_t, int64_t>>* added) {
  while (c->next < c->frames.size()) {
    if (c->resume >= hi) return Status::Ok();  // its next data lies past this window
    std::unique_ptr<pb::BucketRecord> record;
    GT_RETURN_IF_ERROR(Load(c, &record));
    int64_t resume = kNone;
    for (; c->slice < record->slices_size(); ++c->slice) {
      const pb::Slice& s = record->slices(c->slice);
      // Empty slices hold nothing to wait for (FirstSight noted them).
      if (s.param_id() != id_ || s.payload_case() != pb::Slice::kFull || s.count() == 0) continue;
      if (s.offset() >= hi) {
        resume = s.offset();
        break;
      }
      GT_RETURN_IF_ERROR(AddClipped(*c, s, lo, hi, out, added));
      if (s.offset() + s.count() > hi) {
        resume = hi;
        break;
      }
    }
    if (resume != kNone) {
      c->resume = resume;
      Keep(c, std::move(record));
      return Status::Ok();
    }
    ++c->next;
    c->slice = 0;
    c->resume = -1;
    c->decodes = 0;
  }
  return Status::Ok();
}

Status WindowGather::Load(Cursor* c, std::unique_ptr<pb::BucketRecord>* record) {
  const FrameRef* f = c->frames[c->next];
  if (c->kept) {
    kept_bytes_ -= f->raw_bytes;
    *record = std::move(c->kept);
    return Status::Ok();
  }
  auto reader = readers_->Get(set_, c->rank);
  if (!reader.ok()) return reader.status();
  Frame frame;
  Status st = (*reader)->ReadAt(f->offset, &frame);
  if (!st.ok()) return Status::Corruption(NameFile(set_.ranks()[c->rank].path, st.message()));
  if (!frame.bucket) return Error(*c, "no longer a bucket record");
  ++c->decodes;
  if (c->next >= c->first_seen) {
    GT_RETURN_IF_ERROR(FirstSight(*c, *frame.bucket, &c->last_end));
    c->first_seen = c->next + 1;
  }
  *record = std::move(frame.bucket);
  return Status::Ok();
}

Status WindowGather::FirstSight(const Cursor& c, const pb::BucketRecord& record, int64_t* last_end) {
  for (const pb::Slice& s : record.slices()) {
    if (s.param_id() != id_) continue;
    // A rank with a slice of the parameter contributes (MergedOthers counts it), whatever the slice's mode.
    SideValues& others = others_[c.rank];
    others.numel = numel_;
    if (!InParameter(s, numel_)) {
      return Error(c, "slice [" + std::to_string(s.offset()) + ", +" + std::to_string(s.count()) +
                          ") outside parameter of " + std::to_string(numel_) + " elements");
    }
    if (s.payload_case() != pb::Slice::kFull) {
      Status added = AddSlice(s, numel_, &others);
      if (!added.ok()) return Error(c, added.message());
      continue;
    }
    if (s.offset() < *last_end) {
      out_of_order_ = true;
      return Error(c, "full slices of one record out of element order (slice at " + std::to_string(s.offset()) +
                          " after one ending at " + std::to_string(*last_end) + ")");
    }
    *last_end = s.offset() + s.count();
    has_full_ = true;
  }
  return Status::Ok();
}

void WindowGather::Keep(Cursor* c, std::unique_ptr<pb::BucketRecord> record) {
  const uint64_t bytes = c->frames[c->next]->raw_bytes;
  if (kept_bytes_ + bytes > keep_budget_ && c->decodes < kMaxDecodes) return;  // decoded again when needed
  kept_bytes_ += bytes;
  c->kept = std::move(record);
}

Status WindowGather::AddClipped(const Cursor& c, const pb::Slice& s, int64_t lo, int64_t hi, WindowValues* out,
                                std::vector<std::pair<int64_t, int64_t>>* added) {
  // FirstSight checked the range; a frame read again is checked again (the file may have changed since).
  if (!InParameter(s, numel_)) return Error(c, "slice outside the parameter on a second read");
  const int64_t a = std::max(s.offset(), lo), z = std::min(s.offset() + s.count(), hi);
  if (a >= z || out == nullptr) return Status::Ok();
  if (out->narrow() && s.dtype() == pb::FP64) {
    needs_wide_ = true;
    return Error(c, "fp64 values in a parameter kept as float");
  }
  const int64_t begin = a - out->lo(), end = z - out->lo();
  out->Claim(begin, end);
  Status st = out->WithValues([&](auto& v) { return AddFullValueRange(s, a - s.offset(), z - a, v.data() + begin); });
  if (!st.ok()) return Error(c, st.message());
  added->emplace_back(begin, end);
  return Status::Ok();
}

void WindowGather::MergeInto(int rank, std::vector<std::pair<int64_t, int64_t>>* ranges, bool record,
                             WindowValues* out) {
  Join(ranges);
  double d2 = 0, ref2 = 0;
  out->WithValues([&](auto& sv) {
    rank_values_.WithValues([&](auto& rv) {
      if constexpr (std::is_same_v<decltype(sv), decltype(rv)>) {
        for (const auto& [begin, end] : *ranges) {
          for (int64_t i = begin; i < end; ++i) {
            if (!out->set(i)) {
              out->Take(i, rv[i], sv);
            } else if (combine_ == Combine::kSum) {
              sv[i] += rv[i];
            } else {
              const double ref = static_cast<double>(sv[i]), diff = static_cast<double>(rv[i]) - ref;
              d2 += diff * diff;
              ref2 += ref * ref;
            }
          }
        }
      }
    });
  });
  if (!record || combine_ != Combine::kReplicas) return;
  replicas_.diff2 += d2;
  replicas_.ref2 += ref2;
  auto& [rank_d2, rank_ref2] = replicas_.by_rank[rank];
  rank_d2 += d2;
  rank_ref2 += ref2;
}

SideValues WindowGather::MergedOthers() const {
  SideValues side;
  for (const auto& [rank, values] : others_) {
    SideValues v = values;
    MergeRank(rank, 0, std::move(v), combine_, &side);
  }
  side.numel = numel_;
  return side;
}

}  // namespace gradtrace::diff
