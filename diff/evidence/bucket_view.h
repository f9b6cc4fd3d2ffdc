// --self's per-rank x per-bucket view: each rank's POST_REDUCE of one bucket in
// one micro-step against the PRE_REDUCE sum over its group (effective divisor,
// residual, the rank's PRE and POST norms), and the detection of buckets that
// accumulate across micro-steps.
//
// Accumulating buckets: DDP under gradient accumulation with every micro-step
// outside no_sync all-reduces each micro-step while .grad accumulates, so the
// hook's PRE_REDUCE of micro-step k is (micro-step k-1's POST_REDUCE) + the
// rank's local gradient of k, and FINAL is the last POST_REDUCE, not the sum of
// the micro-steps' POST_REDUCE (measured: tests/python/test_accumulated_buckets.py).
// A reduction stays linear, so each one checked on its own still measures its
// divisor (S_k = n POST_{k-1} + sum of local, POST_k = S_k / d); what does not
// hold is summing micro-steps (the diff's --phase post and pre). Told apart by
// FINAL: it equals the last POST_REDUCE, not their sum.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "load/gather.h"
#include "load/trace_set.h"
#include "report/report.h"
#include "status.h"

namespace gradtrace::diff {

// Sum of squares of the values `v` holds (full: filled elements; sketch:
// its positions; stats: the moments' sum of squares).
double SquaredNorm(const SideValues& v);

// Sums for one cell while its reduction is accumulated.
struct CellSums {
  double ss = 0, sp = 0, pp = 0;  // <S,S>, <S,P>, <P,P> over the compared elements
  double pre_sq = 0;              // ||PRE of the rank||^2
  double post_sq = 0;             // ||POST held||^2, compared or not
  int64_t compared = 0;
  int params = 0;
};

// The cell's divisor, residual, norms and verdict from its sums: missing
// without a divisor, inconsistent when the residual exceeds rtol, wrong-divisor
// when the divisor is not the cell's expected one within ctol (the rules the
// parameters are judged by, per reduction; no absolute floor: a bucket is not
// zero up to rounding as a whole).
BucketCell FinishCell(const CellSums& sums, double rtol, double ctol, BucketCell cell);

// (rank, parameter id) pairs whose POST_REDUCE of `step` spans several
// micro-steps and whose FINAL equals the last one (within `rtol` relative),
// not their sum: the parameter's bucket accumulates across micro-steps. Empty
// without FINAL or without multi-micro-step reductions.
Expected<std::set<std::pair<int, int32_t>>> AccumulatingParams(const TraceSet& set, int64_t step, double rtol,
                                                               int threads);

// One finding naming the accumulating buckets, or an empty message when none.
std::string AccumulationFinding(const std::vector<BucketCell>& cells);

// Parameter ids split so that each batch holds at most `max_elems` elements
// (one parameter may exceed it alone): bounds what one gather holds in memory.
std::vector<std::vector<int32_t>> BatchParams(const TraceSet& set, const std::vector<int32_t>& ids, int64_t max_elems);

}  // namespace gradtrace::diff
