// --self A: no reference run needed. For every bucket reduced over a group,
// POST_REDUCE on each member is compared with the sum of PRE_REDUCE over the
// group's ranks; P ≈ S/d gives the effective divisor d = <S,S>/<S,P>. ZeRO-1/2
// POST_REDUCE holds only the rank's partition: its slices' parameter offsets
// locate it in the summed bucket (bucket_numel/partition_* are cross-checked).
//
// Expected divisor, from the loss recipe (the reduction must undo what the
// per-rank loss did): local-mean needs the group size (dp x sp); local-mean-div-sp,
// token-weighted and full-sequence need group size / sp (= dp); an unknown
// recipe is held against the group size.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "gradtrace.pb.h"
#include "report.h"
#include "status.h"
#include "trace_set.h"

namespace gradtrace::diff {

struct SelfOptions {
  std::optional<int64_t> step;  // default: first step with POST_REDUCE records
  std::optional<double> rtol;
  int threads = 0;
  bool progress = false;
};

// The divisor the loss recipe of `c` needs for a reduction over `group_size` ranks.
double ExpectedDivisor(const pb::Config& c, int group_size);

Expected<Report> SelfCheckSet(const TraceSet& set, const SelfOptions& options);
Expected<Report> RunSelfCheck(const std::string& dir, const SelfOptions& options);

}  // namespace gradtrace::diff
