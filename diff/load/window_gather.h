// Windowed reassembly (issue 24 item 2): one parameter on one side, a window
// of elements [lo, hi) at a time, so memory follows the window and the frames
// in flight, never the parameter (gather.h holds a parameter whole).
//
// The frames holding the parameter are grouped per rank by record (micro-step,
// bucket, group). Within a record a writer's chunks hold the parameter's
// elements in ascending order (chunking.h cuts only a chunk's last slice, and
// it continues in the next chunk), so each record gets a cursor: a window
// decodes the cursor's frames from where the last window stopped, adds their
// full slices clipped to the window, and stops at the first frame reaching
// past it. That frame is kept for the next window while the side's kept frames
// stay within a byte budget; past it the frame is decoded again (at most
// kMaxDecodes times, then kept anyway, so a frame spread over many windows is
// not decoded once per window). Ranks are merged per window as MergeRank
// merges them: replicas compared element by element, sums added.
//
// Sketch and stats slices are small: they are taken whole, per rank, the first
// time their frame is decoded, and merged over ranks by MergeRank at the end.
//
// Work is proportional to the data, not to the windows' extent or count:
// which elements of a window are set is an epoch stamp (no clearing per
// window), ranks merge over the ranges they hold, a window visits only the
// cursors with data in it (a heap by next element), and the caller skips
// windows no cursor has data for (NextData), so a huge declared numel with few
// slices costs nothing.
//
// A record whose full slices of the parameter are not in ascending,
// non-overlapping element order (none of our writers makes one; the format
// allows it) cannot be windowed: Gather then returns an error and
// out_of_order() is true; the caller compares the parameter whole instead.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <queue>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "load/gather.h"

namespace gradtrace::diff {

// Values of elements [lo, lo + n) of one parameter on one side.
class WindowValues {
 public:
  explicit WindowValues(bool narrow) : narrow_(narrow) {}
  // Starts a window; nothing in it is set.
  void Reset(int64_t lo, int64_t n);
  int64_t lo() const { return lo_; }
  int64_t size() const { return n_; }
  bool narrow() const { return narrow_; }
  int64_t covered() const { return covered_; }  // elements set
  bool complete() const { return covered_ == n_; }
  bool set(int64_t i) const { return stamp_[i] == epoch_; }
  double at(int64_t i) const { return narrow_ ? static_cast<double>(v32_[i]) : v64_[i]; }
  // Marks [begin, end) set, zeroing the elements that were not; returns how many were not.
  int64_t Claim(int64_t begin, int64_t end);
  // Calls f with the value storage in use (float when narrow, else double).
  template <typename F>
  decltype(auto) WithValues(F&& f) {
    return narrow_ ? f(v32_) : f(v64_);
  }
  template <typename F>
  decltype(auto) WithValues(F&& f) const {
    return narrow_ ? f(v32_) : f(v64_);
  }
  // For merging: element i becomes set with value x (counted).
  template <typename T>
  void Take(int64_t i, T x, std::vector<T>& values) {
    stamp_[i] = epoch_;
    values[i] = x;
    ++covered_;
  }

 private:
  bool narrow_;
  int64_t lo_ = 0, n_ = 0, covered_ = 0;
  std::vector<float> v32_;
  std::vector<double> v64_;
  std::vector<uint16_t> stamp_;  // element i is set when stamp_[i] == epoch_
  uint16_t epoch_ = 0;
};

// Replica agreement of full values over the windows (gather.h SideValues' replica_* fields).
struct ReplicaSums {
  double diff2 = 0, ref2 = 0;
  std::map<int, std::pair<double, double>> by_rank;  // rank -> (diff2, ref2) against the ranks before it
};

class WindowGather {
 public:
  // A frame is decoded at most this many times before it is kept past the budget.
  static constexpr int kMaxDecodes = 3;

  // Parameter `id` of `set`, from `frames` (SelectFrames' output). `narrow`:
  // float storage (replicas of at most 32-bit values); an fp64 slice then
  // stops Gather with an error and needs_wide().
  WindowGather(const TraceSet& set, const std::vector<std::vector<const FrameRef*>>& frames, int32_t id,
               Combine combine, bool narrow, ReaderCache* readers, uint64_t keep_budget = 16u << 20);

  // Positions every cursor on its first full data (decoding frames without
  // any, and taking their sketch and stats slices). Call once, or again after
  // all windows to go over the full values a second time.
  Status Start();
  // The smallest element not yet gathered that some cursor holds full values
  // for, after the last window; max() when none.
  int64_t NextData() const;
  // Merged full values of [lo, hi) into *out (reset first). Windows must come
  // in ascending order after Start, each starting at or after the last one's
  // end. `record`: count coverage and replica agreement (the first pass).
  Status Gather(int64_t lo, int64_t hi, bool record, WindowValues* out);

  // After the first pass: the side's sketch and stats values merged over ranks
  // (no full values), with the ranks that contributed.
  SideValues MergedOthers() const;
  bool has_full() const { return has_full_; }
  int64_t covered() const { return covered_; }  // full elements, over the first pass's windows
  const ReplicaSums& replicas() const { return replicas_; }
  bool out_of_order() const { return out_of_order_; }
  bool needs_wide() const { return needs_wide_; }
  int64_t numel() const { return numel_; }

 private:
  struct Cursor {
    int rank = 0;
    std::vector<const FrameRef*> frames;  // of one record, in file order
    size_t next = 0;                      // first frame not yet used up
    size_t first_seen = 0;                // frames[0, first_seen) were decoded at least once
    int slice = 0;                        // first slice of frames[next] not yet used up
    int64_t last_end = 0;                 // end of the last full slice seen (order check)
    int64_t resume = -1;                  // first element frames[next] holds past the last window; -1 unknown
    int decodes = 0;                      // times frames[next] was decoded
    std::unique_ptr<pb::BucketRecord> kept;
  };
  static constexpr int64_t kNone = std::numeric_limits<int64_t>::max();

  // Back on the heap unless its frames are used up.
  void Wait(size_t index);
  // Uses up the cursor's frames for [lo, hi) into `out` (null: none to add), noting the ranges added.
  Status Advance(Cursor* c, int64_t lo, int64_t hi, WindowValues* out, std::vector<std::pair<int64_t, int64_t>>* added);
  // The record of c->frames[c->next]: kept, or read (first time: sketch and stats taken, order checked).
  Status Load(Cursor* c, std::unique_ptr<pb::BucketRecord>* record);
  Status FirstSight(const Cursor& c, const pb::BucketRecord& record, int64_t* last_end);
  void Keep(Cursor* c, std::unique_ptr<pb::BucketRecord> record);
  Status AddClipped(const Cursor& c, const pb::Slice& s, int64_t lo, int64_t hi, WindowValues* out,
                    std::vector<std::pair<int64_t, int64_t>>* added);
  void MergeInto(int rank, std::vector<std::pair<int64_t, int64_t>>* ranges, bool record, WindowValues* out);
  Status Error(const Cursor& c, const std::string& what) const;

  const TraceSet& set_;
  int32_t id_;
  int64_t numel_;
  Combine combine_;
  ReaderCache* readers_;
  uint64_t keep_budget_, kept_bytes_ = 0;
  std::vector<Cursor> cursors_;  // by rank, then record
  // (resume, cursor index) of every cursor with frames left: the next window's cursors are at the top.
  std::priority_queue<std::pair<int64_t, size_t>, std::vector<std::pair<int64_t, size_t>>, std::greater<>> waiting_;
  std::vector<size_t> active_;        // this window's cursors, in cursors_ order
  std::map<int, SideValues> others_;  // per rank: sketch and stats values
  WindowValues rank_values_;          // a later rank's values, before merging
  bool has_full_ = false, out_of_order_ = false, needs_wide_ = false;
  int64_t covered_ = 0;
  ReplicaSums replicas_;
};

}  // namespace gradtrace::diff
