// The streamed comparison (issue 24 item 1): a unit of parameters compared
// straight from the decoded frames of both sides (their slices' bytes viewed,
// not copied: record_view.h), walked in step, one frame per side at a time
// (plus the frames a later unit reads, StreamCache), values unshuffled a block
// at a time into buffers that stay in cache and summed there (metrics.h
// FullSums), with no reassembly of whole parameters, no zeroed buffers and no
// fresh memory per unit.
//
// It takes the usual FINAL and POST layout and leaves everything else to the
// reassembling paths (gather.h, window_gather.h), which give the same numbers
// bit for bit (FullSums' blocks) where both apply:
// - combine is replicas (never PRE_REDUCE's sums over ranks);
// - per side, every rank holding the unit's parameters holds the same frames
//   (same catalogue entries) with the same stored bytes as the first such rank:
//   replicas that agree exactly, or one rank. Frames that differ, ZeRO
//   partitions included, need the element-wise replica merge;
// - one micro-step (no accumulation), full slices only, each parameter's
//   slices contiguous and ascending from element 0 to its end, and the
//   parameters in the same order on both sides.
// Anything else, bad input included, returns false with nothing written: the
// caller compares the unit by reassembly, which also reports errors in its
// own words. Values that are not finite on a side with replicas go that way
// too (the replica merge's rules for them live there).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "compare/align.h"
#include "compare/side_compare.h"
#include "load/gather.h"

namespace gradtrace::diff {

// One worker's state: the frames each side decoded, kept while a later unit
// reads them (decoded bytes within a budget per worker, half per side), with
// the ranks whose copy of each was found byte for byte the same. Units cut
// frames between parameters and a worker takes neighbouring units in a row,
// so a frame at a cut is decoded once, as ReaderCache keeps frames for the
// reassembling paths.
class StreamCache {
 public:
  static constexpr uint64_t kDefaultBudget = uint64_t{48} << 20;
  explicit StreamCache(uint64_t budget = kDefaultBudget) : budget_(budget) {}

  struct Slot {
    const TraceSet* set = nullptr;
    int rank = -1;
    uint64_t offset = 0;
    UnitRange units;  // the units it is kept for; none ahead of the walk: free
    bool decoded = false;
    RecordView view;                             // full slices' bytes viewed, not copied
    std::vector<std::pair<int, uint64_t>> same;  // (rank, offset) of copies found the same record
  };
  // Which unit reads each of `set`'s parameters (by param id; -1: none), as ReaderCache::Plan.
  void Plan(const TraceSet& set, std::vector<int> unit_of_param) { plans_[&set] = std::move(unit_of_param); }
  // Unit `unit` starts: frames no unit from here on (in the walk's direction, UnitWalk) reads are free.
  void BeginUnit(size_t unit);
  // Frame f of rank `rank` on side `side`: its slot, and whether it holds it decoded already; otherwise the slot
  // is the one to decode it into (and then to Fill in).
  std::pair<Slot*, bool> Lookup(int side, const TraceSet& set, int rank, const FrameRef& f);
  // The cursor is past the slot's frame: free unless a later unit reads it.
  void Leave(Slot* slot) const;
  TraceReader::StoredFrame& stored() { return stored_; }  // the first holder's bytes of the frame being loaded
  TraceReader::StoredFrame& other() { return other_; }    // another rank's copy, being checked

 private:
  std::vector<std::unique_ptr<Slot>> slots_[2];
  std::map<const TraceSet*, std::vector<int>> plans_;
  UnitWalk walk_;
  uint64_t budget_;
  TraceReader::StoredFrame stored_, other_;
};

// What the streamed walk measured for one pair.
struct StreamedParam {
  Metrics metrics;
  SideSummary a, b;
};

// Compares the pairs `pairs` (indexes into al.params) of one unit, B (`y`)
// against A (`x`), from the frames SelectFrames picked. True: (*out)[k] holds
// pairs[k]'s result for every k. False: the unit needs reassembly (above).
bool CompareStreamed(const TraceSet& x, const TraceSet& y, const std::vector<std::vector<const FrameRef*>>& frames_x,
                     const std::vector<std::vector<const FrameRef*>>& frames_y, const Alignment& al,
                     const std::vector<size_t>& pairs, ReaderCache* readers, StreamCache* cache,
                     std::vector<StreamedParam>* out);

}  // namespace gradtrace::diff
