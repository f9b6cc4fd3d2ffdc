// The relative tolerance a comparison is judged with.
//
// Default bound (documented in REPORT_SCHEMA.md, "Tolerance"):
//
//   rtol = min(0.05, 16 * u * sqrt(N))
//
// u is the unit roundoff of the coarser of the two gradient dtypes (fp64 2^-53,
// fp32 2^-24, fp16 2^-11, bf16 2^-8). N is the number of summands that reach one
// gradient element in either configuration: tokens per optimizer step
// (batch x seq_len x gas) times the ranks the reduction adds (world), the larger
// of A and B. Two configurations add the same terms in different orders; each
// order's rounding error is a sum of N independent errors of size <= u*|partial
// sum|, whose typical magnitude grows like u*sqrt(N) (the worst case, (N-1)*u, is
// far too loose to separate "reordered" from "wrong"). The factor 16 covers
// cancellation in the sums and the final rounding to the stored dtype; the cap
// keeps bf16 from hiding real mismatches. Unknown config fields count as 1, and
// N is at least 1024.
//
// --noise A2 replaces the bound with a measurement: per parameter,
// rtol_p = max(4 * rel_error(A, A2)_p, 4u). --rtol X overrides both.
#pragma once

#include <string>

#include "gradtrace.pb.h"

namespace gradtrace::diff {

struct Tolerance {
  double rtol = 0;
  std::string source;  // "default", "noise", "rtol"
  std::string bound;   // the bound in words, for reports
};

double UnitRoundoff(pb::DType dtype);  // fp32 when unspecified
// Summands reaching one gradient element in configuration `c` (see above).
double Summands(const pb::Config& c);
Tolerance DefaultTolerance(const pb::Config& a, const pb::Config& b);
Tolerance FixedTolerance(double rtol);

}  // namespace gradtrace::diff
