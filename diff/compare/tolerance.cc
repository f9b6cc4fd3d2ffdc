#include "compare/tolerance.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "dtype.h"

namespace gradtrace::diff {

double UnitRoundoff(pb::DType dtype) {
  const DTypeInfo* row = FindDType(dtype);
  if (row == nullptr) row = FindDType(pb::FP32);
  return std::ldexp(1.0, -(row->mantissa_bits + 1));
}

double Summands(const pb::Config& c) {
  auto one = [](double v) { return v > 0 ? v : 1.0; };
  double n = one(c.batch()) * one(c.seq_len()) * one(c.gas()) * one(c.world());
  return std::max(n, 1024.0);
}

namespace {

// The communication term of one side: its comm dtype when coarser than the
// compute dtype u, else none (0).
double CommRoundoff(const pb::Config& c, double u) {
  if (c.comm_dtype() == pb::DTYPE_UNSPECIFIED) return 0;
  const double uc = UnitRoundoff(c.comm_dtype());
  return uc > u ? uc : 0;
}

std::string Side(bool a, bool b) { return a && b ? "A and B" : a ? "A" : "B"; }

}  // namespace

Tolerance DefaultTolerance(const pb::Config& a, const pb::Config& b) {
  double u = std::max(UnitRoundoff(a.dtype()), UnitRoundoff(b.dtype()));
  pb::DType coarse = UnitRoundoff(a.dtype()) >= UnitRoundoff(b.dtype()) ? a.dtype() : b.dtype();
  if (coarse == pb::DTYPE_UNSPECIFIED) coarse = pb::FP32;
  double n = std::max(Summands(a), Summands(b));
  // Communication in a coarser dtype (tolerance.h): 4 * u_c * sqrt(W), W the ranks summed in it.
  const double uca = CommRoundoff(a, u), ucb = CommRoundoff(b, u);
  const double uc = std::max(uca, ucb);
  const pb::Config& comm = ucb >= uca ? b : a;
  const double w = std::max(2.0, static_cast<double>(comm.world()));
  const double comm_term = uc > 0 ? 4 * uc * std::sqrt(w) : 0;
  Tolerance t;
  t.rtol = std::min(0.05, 16 * u * std::sqrt(n) + comm_term);
  t.source = "default";
  char buf[400];
  if (uc > 0) {
    std::snprintf(buf, sizeof(buf),
                  "rtol = min(0.05, 16*u*sqrt(N) + 4*u_c*sqrt(W)) = %.3g with u = %.3g (%s), N = %.0f summands, "
                  "u_c = %.3g (%s communication), W = %.0f ranks",
                  t.rtol, u, DTypeName(coarse), n, uc, DTypeName(comm.comm_dtype()), w);
    const bool both = uca == ucb;
    t.precision = DTypeName(comm.comm_dtype());
    t.precision_source = Side(both || &comm == &a, both || &comm == &b) + " communicates in " + t.precision +
                         (comm.comm_hook().empty() ? "" : " (" + comm.comm_hook() + ")");
  } else {
    std::snprintf(buf, sizeof(buf), "rtol = min(0.05, 16*u*sqrt(N)) = %.3g with u = %.3g (%s), N = %.0f summands",
                  t.rtol, u, DTypeName(coarse), n);
    if (FindDType(coarse) && FindDType(coarse)->mantissa_bits < FindDType(pb::FP32)->mantissa_bits) {  // below fp32
      t.precision = DTypeName(coarse);
      t.precision_source = Side(a.dtype() == coarse, b.dtype() == coarse) + " trains in " + t.precision;
    }
  }
  t.bound = buf;
  return t;
}

Tolerance FixedTolerance(double rtol) {
  Tolerance t;
  t.rtol = rtol;
  t.source = "rtol";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "rtol = %.3g (--rtol)", rtol);
  t.bound = buf;
  return t;
}

void SetAbsoluteFloor(double rtol_default, double g_rms, Tolerance* t) {
  t->atol = std::isfinite(g_rms) ? rtol_default * g_rms : 0;
  char buf[160];
  std::snprintf(buf, sizeof(buf), "; absolute floor atol = %.3g x g_rms %.3g = %.3g", rtol_default, g_rms, t->atol);
  t->bound += buf;
}

}  // namespace gradtrace::diff
