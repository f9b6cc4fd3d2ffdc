// A trace set holding one huge fp32 parameter (issue 24 item 2): the input of
// the test that gradtrace-diff's memory is bounded by frames, not parameters.
//
// The writer never holds the parameter: it writes the FINAL record already cut
// into chunks (FORMAT.md 7, the layout TraceWriter's own splitting gives), one
// chunk's values at a time. Values are k/1024 for k in [-1000, 1000] drawn from
// the element index, so factor x value is exact in fp32 for factor 2 and the
// byte-shuffled payload compresses (the low mantissa bytes are zero).
#pragma once

#include <cstdint>
#include <string>

#include "status.h"

namespace gradtrace::testing {

struct BigParamSpec {
  int64_t numel = int64_t{1} << 28;  // elements of "big.weight" (1 GiB in fp32)
  double factor = 1;                 // every value multiplied by this (B = factor x A)
  int dp = 1;                        // ranks, each holding the whole gradient (replicas)
  std::string run_id = "big-param";
};

// The element `index` of the reference gradient (before the factor).
float BigParamValue(int64_t index);

// Writes rank-NNNNN.gtrace for every rank of `spec` into `dir` (created if
// needed): one step, FINAL only, chunks of kBigParamChunk elements.
Status WriteBigParamSet(const std::string& dir, const BigParamSpec& spec);

// Elements per chunk: 4 MiB of fp32 less room for the record's other fields,
// so every chunk fits the writer's 4 MiB target and is written as one frame.
inline constexpr int64_t kBigParamChunk = (int64_t{1} << 20) - 256;

}  // namespace gradtrace::testing
