// The stats kernel: moments_kernel.h at the baseline vector width (16 bytes),
// and the dispatch to the AVX2 build of the same kernel (moments_avx2.cc) on
// CPUs that have it. GCC/Clang vector extensions fix the lanes whatever the
// target's SIMD width, so both the speed and the summation order hold without
// -ffast-math and without relying on the auto-vectorizer.
#include "moments.h"

#include "cpu_features.h"
#include "moments_kernel.h"

namespace gradtrace {

#if GRADTRACE_MOMENTS_AVX2
// moments_avx2.cc: the same kernel with 32-byte vectors. Only called when the CPU has AVX2.
Moments BlockMomentsAvx2(pb::DType dtype, const uint8_t* p, int64_t count, bool* handled);

#endif

bool MomentsKernelIsAvx2() {
#if GRADTRACE_MOMENTS_AVX2
  return CpuHasAvx2();
#else
  return false;
#endif
}

Moments BlockMomentsElementwise(pb::DType dtype, const void* data, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  switch (DTypeSize(dtype)) {
    case 1:
      return BlockMomentsOf<2, 1>(p, n, LoadEach<2, 1>{dtype});
    case 2:
      return BlockMomentsOf<2, 2>(p, n, LoadEach<2, 2>{dtype});
    case 4:
      return BlockMomentsOf<2, 4>(p, n, LoadEach<2, 4>{dtype});
    case 8:
      return BlockMomentsOf<2, 8>(p, n, LoadEach<2, 8>{dtype});
    default: {
      Moments m;  // unknown dtype: nothing is finite (the writer refuses such slices anyway)
      m.nonfinite = n;
      return m;
    }
  }
}

void Moments::Merge(const Moments& o) {
  count += o.count;
  nonfinite += o.nonfinite;
  AddCompensated(sum, sum_c, o.sum);
  if (std::isfinite(sum)) sum_c += o.sum_c;
  AddCompensated(sum_sq, sum_sq_c, o.sum_sq);
  if (std::isfinite(sum_sq)) sum_sq_c += o.sum_sq_c;
  abs_max = std::max(abs_max, o.abs_max);
}

void Moments::Fill(pb::StatsPayload* out) const {
  out->set_count(count);
  out->set_sum(sum + sum_c);
  out->set_sum_sq(sum_sq + sum_sq_c);
  out->set_abs_max(abs_max);
  out->set_nonfinite(nonfinite);
}

Moments BlockMomentsBaseline(pb::DType dtype, const void* data, int64_t count) {
  bool handled = false;
  Moments m = VectorBlockMoments<2>(dtype, static_cast<const uint8_t*>(data), count, &handled);
  return handled ? m : BlockMomentsElementwise(dtype, data, count);
}

Moments BlockMoments(pb::DType dtype, const void* data, int64_t count) {
#if GRADTRACE_MOMENTS_AVX2
  if (CpuHasAvx2()) {
    bool handled = false;
    Moments m = BlockMomentsAvx2(dtype, static_cast<const uint8_t*>(data), count, &handled);
    if (handled) return m;
  }
#endif
  return BlockMomentsBaseline(dtype, data, count);
}

Moments SliceMoments(pb::DType dtype, const void* data, int64_t count) {
  const auto* p = static_cast<const uint8_t*>(data);
  const size_t w = DTypeSize(dtype);
  Moments total;
  for (int64_t b = 0; b < count; b += kMomentsBlock) {
    total.Merge(BlockMoments(dtype, p + b * w, std::min(kMomentsBlock, count - b)));
  }
  return total;
}

}  // namespace gradtrace
