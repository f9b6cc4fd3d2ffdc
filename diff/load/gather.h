// Second pass: re-read the frames a comparison needs and reassemble each
// parameter's gradient on one side from its slices, ZeRO partitions and ranks.
//
// Per rank, slices of the selected frames are summed (micro-steps of one step
// add up, as gradient accumulation does); ranks are then combined either as
// replicas (POST_REDUCE, FINAL: every rank holding an element must agree, and
// disagreement is recorded) or as a sum (PRE_REDUCE: the total that enters the
// reduction). Memory: two dense buffers and two byte maps per parameter in the
// unit, plus one decoded frame at a time per reader; so only parameters of at
// most DiffOptions.window_elements come here, larger ones are reassembled a
// window at a time (window_gather.h).
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "compare/metrics.h"
#include "gradtrace.pb.h"
#include "load/trace_set.h"
#include "record_view.h"
#include "trace_reader.h"

namespace gradtrace::diff {

// One parameter's values on one side, in whatever modes the slices carried.
struct SideValues {
  int64_t numel = 0;
  // Full mode: dense values and which elements were seen. Values are kept as
  // float (`narrow`, set by the gatherer before the first slice) when they are
  // exact in float and only copied, not summed: half the memory and memory
  // traffic; otherwise (fp64, or sums over ranks) as double.
  bool narrow = false;
  std::vector<float> dense32;  // narrow
  std::vector<double> dense;   // !narrow
  std::vector<uint8_t> filled;
  int64_t covered = 0;
  // Sketch mode: position -> value.
  std::map<int64_t, double> sparse;
  // Stats mode.
  Moments moments;
  bool has_stats = false;
  bool stats_sums_only = false;  // moments of sums are not the sum of moments
  std::set<int64_t> stats_offsets;
  // Replica agreement (POST/FINAL): over elements held by more than one rank.
  double replica_diff2 = 0, replica_ref2 = 0, replica_max_abs = 0;
  int64_t replica_elems = 0;
  int replica_rank = -1, replica_other = -1;  // worst disagreeing pair
  double replica_worst = 0;                   // worst per-rank relative disagreement
  double ref_norm2 = -1;                      // cache: squared norm of complete dense values (-1: not known)
  int ranks = 0;                              // ranks that contributed

  bool has_full() const { return !dense.empty() || !dense32.empty(); }
  // Calls f with the dense storage in use (dense32 when narrow, else dense).
  template <typename F>
  decltype(auto) WithDense(F&& f) {
    return narrow ? f(dense32) : f(dense);
  }
  template <typename F>
  decltype(auto) WithDense(F&& f) const {
    return narrow ? f(dense32) : f(dense);
  }
  double at(int64_t e) const { return narrow ? static_cast<double>(dense32[e]) : dense[e]; }
  // Switches to double storage (an fp64 slice arrived, or merging with a wide side).
  void Widen();
  bool complete() const { return has_full() && covered == numel; }
};

enum class Combine { kReplicas, kSum };

// Decodes the slices of `slice` into `v` (allocating what its mode needs).
// `add`: accumulate onto existing values (micro-steps); otherwise overwrite.
Status AddSlice(const pb::Slice& slice, int64_t numel, SideValues* v);
// The same for a slice whose full bytes are held in `data` (a RecordView's), not in the slice.
Status AddSlice(const pb::Slice& slice, std::string_view data, int64_t numel, SideValues* v);

// Merges one rank's values into the side's: kSum adds; kReplicas fills
// elements not yet seen and compares the rest (tolerance-free: the caller
// judges replica_* against its rtol).
void MergeRank(int rank, int first_rank, SideValues&& rank_values, Combine combine, SideValues* side);

// The units that read frame `f`: the first and the last ({-1, -1}: none), from which unit reads each parameter (by
// param id; -1: none), as ReaderCache::Plan and StreamCache::Plan are given it.
struct UnitRange {
  int first = -1, last = -1;
};
UnitRange UnitsOf(const std::vector<int>& unit_of_param, const FrameRef& f);

// Where a worker is in its walk over the work units (ParallelForBlocks: front to back or back to front, jumping
// where it takes another block's units), for its caches: a frame is worth keeping while a unit ahead reads it.
// The direction is that of the last step; before the second unit, either.
class UnitWalk {
 public:
  void Begin(int unit) {
    if (started_ && unit != unit_) direction_ = unit > unit_ ? 1 : -1;
    started_ = true;
    unit_ = unit;
  }
  int unit() const { return unit_; }
  // Whether this unit or one ahead reads a frame that units r read.
  bool Live(UnitRange r) const {
    return r.last >= 0 && (direction_ > 0 ? r.last >= unit_ : direction_ < 0 ? r.first <= unit_ : true);
  }
  // Whether a unit ahead (not this one) reads it.
  bool Later(UnitRange r) const {
    if (r.last < 0) return false;
    return direction_ > 0 ? r.last > unit_ : direction_ < 0 ? r.first < unit_ : r.first < unit_ || r.last > unit_;
  }

 private:
  int unit_ = 0;
  int direction_ = 0;  // 1: front to back, -1: back to front, 0: not known yet
  bool started_ = false;
};

// Per-thread open readers, one per (set, rank), opened on first use, and the
// decoded frames worth keeping, within a byte budget:
// - Replicas: ranks that hold the same gradient (FINAL, POST) write
//   byte-identical frames. A frame whose stored bytes equal a kept one's is
//   read and compared, not decompressed and parsed again; references (format
//   1.6) are compared by what they name (TraceReader::SameRecord).
// - Cuts: work units cut chunked records between parameters, so the frame
//   holding a cut serves two units (or more); a thread that gathers
//   neighbouring units one after the other (ParallelForBlocks) decodes it once.
class ReaderCache {
 public:
  // Bytes of frames kept (stored and decoded); 0 keeps none.
  static constexpr uint64_t kDefaultFrameBudget = uint64_t{48} << 20;
  explicit ReaderCache(uint64_t frame_budget = kDefaultFrameBudget) : frame_budget_(frame_budget) {}

  Expected<TraceReader*> Get(const TraceSet& set, int rank);
  // Which unit reads each of `set`'s parameters (by param id; -1: none).
  void Plan(const TraceSet& set, std::vector<int> unit_of_param);
  // Unit `unit` starts: frames no unit from `unit` on reads are dropped (all
  // frames of a set without a plan are kept while the budget allows).
  void BeginUnit(size_t unit);
  // This unit is done with `set`: its frames that no later unit reads go.
  void SetDone(const TraceSet& set);
  // The bucket record frame `f` of `set`, kept or decoded; errors name the
  // file; its full slices' bytes are viewed (record_view.h). `replicas`: other
  // ranks may hold byte-identical copies (FINAL, POST), so it is kept for them.
  // Valid until the next call or BeginUnit.
  Expected<const RecordView*> Bucket(const TraceSet& set, const FrameRef& f, bool replicas);
  uint64_t decoded() const { return decoded_; }            // frames decompressed and parsed
  uint64_t deduplicated() const { return deduplicated_; }  // frames found equal to a kept one by their bytes

 private:
  struct Position {
    const TraceSet* set = nullptr;
    int rank = 0;
    uint64_t offset = 0;
    bool operator==(const Position& o) const { return set == o.set && rank == o.rank && offset == o.offset; }
  };
  struct PositionHash {
    size_t operator()(const Position& p) const;
  };
  struct Kept {
    const TraceSet* set = nullptr;
    std::vector<Position> at;  // the frames with these bytes
    // ContentKey and the stored frame, by which copies are found: only for a replica's frame (Bucket's
    // `copies`); a frame read in one pass has neither.
    uint64_t content = 0;
    TraceReader::StoredFrame stored;
    std::unique_ptr<RecordView> frame;
    UnitRange units;     // the units that read it ({-1, -1}: no plan)
    uint64_t bytes = 0;  // stored plus decoded
  };
  using KeptList = std::list<Kept>;
  // A hash of the set and the frame header (CRC and lengths): frames with equal bytes share it.
  static uint64_t ContentKey(const TraceSet& set, const TraceReader::StoredFrame& stored);
  // A hash of the set and a reference's record without its values_from (format 1.6): replicas' references share it.
  static uint64_t ReferenceKey(const TraceSet& set, const pb::BucketRecord& ref);
  // Frames up to this size are parsed to find references among them (a reference holds one short entry per slice).
  static constexpr uint32_t kReferenceParseLimit = uint32_t{1} << 20;
  void Drop(KeptList::iterator it);

  std::map<std::pair<const TraceSet*, int>, std::unique_ptr<TraceReader>> readers_;
  std::map<const TraceSet*, std::vector<int>> plans_;
  // Kept frames, found by position and by content in constant time: small frames (sketches) can make
  // thousands of them, and a thousand ranks as many positions each.
  KeptList kept_;
  std::unordered_map<Position, Kept*, PositionHash> by_position_;
  std::unordered_multimap<uint64_t, Kept*> by_content_;
  TraceReader::StoredFrame scratch_stored_;
  pb::BucketRecord reference_;           // the last reference parsed to find its copies
  bool references_ = false;              // a reference was kept: small frames are parsed to find their copies
  std::unique_ptr<RecordView> scratch_;  // the last frame decoded and not kept
  uint64_t frame_budget_ = 0, kept_bytes_ = 0, decoded_ = 0, deduplicated_ = 0;
  size_t planned_ = 0;  // kept frames a plan's units read (units.last >= 0): SetDone has work only then
  UnitWalk walk_;
};

// What to read from one set.
struct Selection {
  int64_t step = 0;
  pb::Phase phase = pb::FINAL;
};

// Frames of `set` matching `sel`, grouped by rank, each list in file order.
std::vector<std::vector<const FrameRef*>> SelectFrames(const TraceSet& set, const Selection& sel);

// Some ranks' frames: (rank, its frames in file order), ranks ascending. The evidence passes gather one member
// or one POST_REDUCE at a time; a world-sized list for each took O(world^2) at 10,000 ranks (issue 42).
using FramesOfRanks = std::vector<std::pair<int, std::vector<const FrameRef*>>>;

// Reassembles the parameters `ids` (ids in `set`'s table) from `frames`
// (SelectFrames' output, or some ranks' frames). out[i] corresponds to ids[i].
Status GatherParams(const TraceSet& set, const std::vector<std::vector<const FrameRef*>>& frames,
                    const std::vector<int32_t>& ids, Combine combine, ReaderCache* readers,
                    std::vector<SideValues>* out);
Status GatherParams(const TraceSet& set, const FramesOfRanks& frames, const std::vector<int32_t>& ids, Combine combine,
                    ReaderCache* readers, std::vector<SideValues>* out);

}  // namespace gradtrace::diff
