// What the CPU running us can do, asked once: the kernels built for AVX2
// (moments_avx2.cc, diff's block_sums_avx2.cc) are called only where it says so.
#pragma once

namespace gradtrace {

inline bool CpuHasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

}  // namespace gradtrace
