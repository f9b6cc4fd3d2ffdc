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
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "compare/metrics.h"
#include "gradtrace.pb.h"
#include "load/trace_set.h"
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

// Merges one rank's values into the side's: kSum adds; kReplicas fills
// elements not yet seen and compares the rest (tolerance-free: the caller
// judges replica_* against its rtol).
void MergeRank(int rank, int first_rank, SideValues&& rank_values, Combine combine, SideValues* side);

// Per-thread open readers, one per (set, rank), opened on first use.
class ReaderCache {
 public:
  Expected<TraceReader*> Get(const TraceSet& set, int rank);

 private:
  std::map<std::pair<const TraceSet*, int>, std::unique_ptr<TraceReader>> readers_;
};

// What to read from one set.
struct Selection {
  int64_t step = 0;
  pb::Phase phase = pb::FINAL;
};

// Frames of `set` matching `sel`, grouped by rank, each list in file order.
std::vector<std::vector<const FrameRef*>> SelectFrames(const TraceSet& set, const Selection& sel);

// Reassembles the parameters `ids` (ids in `set`'s table) from `frames`
// (SelectFrames' output). out[i] corresponds to ids[i].
Status GatherParams(const TraceSet& set, const std::vector<std::vector<const FrameRef*>>& frames,
                    const std::vector<int32_t>& ids, Combine combine, ReaderCache* readers,
                    std::vector<SideValues>* out);

}  // namespace gradtrace::diff
