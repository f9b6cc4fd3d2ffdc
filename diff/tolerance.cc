#include "tolerance.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "slice_codec.h"

namespace gradtrace::diff {

double UnitRoundoff(pb::DType dtype) {
  switch (dtype) {
    case pb::FP64:
      return std::ldexp(1.0, -53);
    case pb::FP16:
      return std::ldexp(1.0, -11);
    case pb::BF16:
      return std::ldexp(1.0, -8);
    default:
      return std::ldexp(1.0, -24);
  }
}

double Summands(const pb::Config& c) {
  auto one = [](double v) { return v > 0 ? v : 1.0; };
  double n = one(c.batch()) * one(c.seq_len()) * one(c.gas()) * one(c.world());
  return std::max(n, 1024.0);
}

Tolerance DefaultTolerance(const pb::Config& a, const pb::Config& b) {
  double u = std::max(UnitRoundoff(a.dtype()), UnitRoundoff(b.dtype()));
  pb::DType coarse = UnitRoundoff(a.dtype()) >= UnitRoundoff(b.dtype()) ? a.dtype() : b.dtype();
  if (coarse == pb::DTYPE_UNSPECIFIED) coarse = pb::FP32;
  double n = std::max(Summands(a), Summands(b));
  Tolerance t;
  t.rtol = std::min(0.05, 16 * u * std::sqrt(n));
  t.source = "default";
  char buf[256];
  std::snprintf(buf, sizeof(buf), "rtol = min(0.05, 16*u*sqrt(N)) = %.3g with u = %.3g (%s), N = %.0f summands", t.rtol,
                u, DTypeName(coarse), n);
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
