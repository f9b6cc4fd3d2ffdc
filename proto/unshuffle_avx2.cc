// The unshuffle kernel with 32-byte vectors (unshuffle.h): this file alone is
// compiled with -mavx2 (proto/CMakeLists.txt). AVX2's unpacks work within each
// 16-byte lane, so each lane interleaves 16 elements as the SSE2 kernel does
// (lane 0 elements 0-15, lane 1 elements 16-31) and a lane permute puts the
// four 4-element groups of each lane back in order.
#include <immintrin.h>

#include "unshuffle.h"

namespace gradtrace {

namespace {

template <bool kAdd>
void Store(float* out, __m256i v) {
  __m256 f = _mm256_castsi256_ps(v);
  if constexpr (kAdd) f = _mm256_add_ps(_mm256_loadu_ps(out), f);
  _mm256_storeu_ps(out, f);
}

template <bool kAdd>
size_t Avx2(const uint8_t* p, size_t n, size_t count, float* out) {
  size_t i = 0;
  for (; i + 32 <= count; i += 32) {
    const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i));
    const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + n + i));
    const __m256i b2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * n + i));
    const __m256i b3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 3 * n + i));
    const __m256i lo01 = _mm256_unpacklo_epi8(b0, b1), hi01 = _mm256_unpackhi_epi8(b0, b1);
    const __m256i lo23 = _mm256_unpacklo_epi8(b2, b3), hi23 = _mm256_unpackhi_epi8(b2, b3);
    const __m256i e0 = _mm256_unpacklo_epi16(lo01, lo23);  // elements 0-3 | 16-19
    const __m256i e1 = _mm256_unpackhi_epi16(lo01, lo23);  // 4-7 | 20-23
    const __m256i e2 = _mm256_unpacklo_epi16(hi01, hi23);  // 8-11 | 24-27
    const __m256i e3 = _mm256_unpackhi_epi16(hi01, hi23);  // 12-15 | 28-31
    Store<kAdd>(out + i, _mm256_permute2x128_si256(e0, e1, 0x20));
    Store<kAdd>(out + i + 8, _mm256_permute2x128_si256(e2, e3, 0x20));
    Store<kAdd>(out + i + 16, _mm256_permute2x128_si256(e0, e1, 0x31));
    Store<kAdd>(out + i + 24, _mm256_permute2x128_si256(e2, e3, 0x31));
  }
  return i;
}

}  // namespace

size_t UnshuffleFloatsAvx2(const uint8_t* planes, size_t n, size_t first, size_t count, float* out, bool add) {
  return add ? Avx2<true>(planes + first, n, count, out) : Avx2<false>(planes + first, n, count, out);
}

}  // namespace gradtrace
