// The stats kernel (moments_kernel.h) with 32-byte vectors: this file alone is
// compiled with -mavx2 (proto/CMakeLists.txt) and moments.cc calls it only on
// CPUs that report AVX2. Not -mfma: a fused multiply-add would round v * v
// once less and change the documented bits.
#include "moments_kernel.h"

namespace gradtrace {

Moments BlockMomentsAvx2(pb::DType dtype, const uint8_t* p, int64_t count, bool* handled) {
  return VectorBlockMoments<4>(dtype, p, count, handled);
}

}  // namespace gradtrace
