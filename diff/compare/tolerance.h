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
// Compressed communication (format 1.4, Config.comm_dtype coarser than the
// gradient dtype: torch's fp16/bf16_compress_hook, FSDP's reduce_dtype, a
// comm_dtype= declaration). Each rank's contribution is rounded once to the
// comm dtype (relative error <= u_c), the W-term sum in that dtype adds up to
// W-1 more roundings whose typical size grows like u_c*sqrt(W), and the result
// is rounded back once. These errors are per element and do not grow with the
// token count N (the tokens were summed in the compute dtype), so they add a
// term rather than replace u:
//
//   rtol = min(0.05, 16 * u * sqrt(N) + 4 * u_c * sqrt(W))
//
// with u_c the comm dtype's unit roundoff and W the side's world (at least 2).
// The factor 4 covers the rounding back and the sum's worst orderings; the
// residual of a rounding of RMS relative size u_c is about u_c/sqrt(3).
// Measured residuals: tests/python/test_compressed_comm.py (DDP, 2 ranks,
// torch 2.15, against one fp32 rank). TTrace (arXiv 2506.09280) is the
// reference point: a tolerance derived from the rounding steps a value went
// through, not from observed noise (its abstract's stance; this bound is ours).
//
// --noise A2 replaces the bound with a measurement: per parameter,
// rtol_p = max(4 * rel_error(A, A2)_p, 4u). --rtol X overrides both.
//
// Absolute floor. A gradient that is zero in exact arithmetic (an attention
// key bias: softmax ignores a shift shared by every key) holds rounding noise
// only, and its noise relative to itself is O(1), so no relative rule can pass
// it. Its noise is rounding of the per-token terms that cancel, which are of
// the size of the step's other gradients, so the floor scales with them:
//
//   atol = rtol_default * g_rms
//
// g_rms is the root mean square of every element compared at this step and
// phase in A (the reference; in --self, the POST_REDUCE values), rtol_default
// the bound above for these configurations (never --rtol or --noise: a loose
// relative tolerance must not widen the floor). A parameter of n compared
// elements then passes when
//
//   ||b - s*a|| <= rtol * ||b|| + atol * sqrt(n)     (s = 1 for "match")
//
// as numpy's allclose does per element. Measured on a real attention (fp32,
// 4 x 64 tokens, tests/python/test_zero_gradient_floor.py): the key bias has
// RMS 7.5e-11 against g_rms 1.28e-3, two reduction orders differ there by
// 7.1e-11 per element (residual 0.87), and atol = 3.9e-8; a real gradient
// below atol is indistinguishable from rounding noise at this dtype.
#pragma once

#include <string>

#include "gradtrace.pb.h"

namespace gradtrace::diff {

struct Tolerance {
  double rtol = 0;
  std::string source;  // "default", "noise", "rtol", "baseline" (--baseline: scaled per parameter, diff_engine.h)
  std::string bound;   // the bound in words, for reports
  double atol = 0;     // the absolute floor per element (0: none)
  // The coarse precision the bound allows for ("bf16", "fp16"; "" for fp32/fp64) and in words whose it is:
  // "B communicates in bf16 (bf16_compress_hook)", "A trains in bf16".
  std::string precision, precision_source;
};

double UnitRoundoff(pb::DType dtype);  // fp32 when unspecified
// Summands reaching one gradient element in configuration `c` (see above).
double Summands(const pb::Config& c);
Tolerance DefaultTolerance(const pb::Config& a, const pb::Config& b);
Tolerance FixedTolerance(double rtol);
// Sets t->atol = rtol_default * g_rms and says so in t->bound.
void SetAbsoluteFloor(double rtol_default, double g_rms, Tolerance* t);

}  // namespace gradtrace::diff
