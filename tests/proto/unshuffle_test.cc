// The unshuffle kernels against the element-by-element definition (FORMAT.md 5:
// byte k of element i at planes[k * n + i]): the same bits for every start, length
// and tail, copied and added, NaN payloads included.
#include "unshuffle.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <random>
#include <vector>

#include "cpu_features.h"

namespace gradtrace {
namespace {

using Kernel = size_t (*)(const uint8_t*, size_t, size_t, size_t, float*, bool);

uint32_t Element(const std::vector<uint8_t>& planes, size_t n, size_t i) {
  uint32_t b = 0;
  for (int k = 0; k < 4; ++k) b |= uint32_t{planes[k * n + i]} << (8 * k);
  return b;
}

// Random bytes: every bit pattern, NaNs with payloads and infinities among them.
std::vector<uint8_t> RandomPlanes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> p(4 * n);
  for (auto& b : p) b = static_cast<uint8_t>(rng());
  return p;
}

// What `kernel` leaves in out for [first, first + count), the elements it did not do
// completed one by one as the codec does; `add` over a start of small finite floats.
void Check(Kernel kernel, size_t width, const std::vector<uint8_t>& planes, size_t n, size_t first, size_t count,
           bool add) {
  std::vector<float> start(count + 1);
  for (size_t i = 0; i < start.size(); ++i) start[i] = static_cast<float>(i % 7) * 0.25f - 0.5f;
  std::vector<float> out = start;
  const size_t done = kernel(planes.data(), n, first, count, out.data(), add);
  ASSERT_EQ(done, count / width * width) << "first " << first << " count " << count;
  for (size_t i = 0; i < count; ++i) {
    const float v = std::bit_cast<float>(Element(planes, n, first + i));
    const float want = i >= done ? start[i] : add ? start[i] + v : v;
    ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(want))
        << "element " << i << " of [" << first << ", +" << count << ") add " << add;
  }
  EXPECT_EQ(out[count], start[count]) << "wrote past the range";
}

void CheckKernel(Kernel kernel, size_t width) {
  const size_t n = 1000;
  const std::vector<uint8_t> planes = RandomPlanes(n, 7);
  for (size_t first : {size_t{0}, size_t{1}, size_t{15}, size_t{31}, size_t{33}, size_t{500}}) {
    for (size_t count :
         {size_t{0}, size_t{5}, size_t{16}, size_t{31}, size_t{32}, size_t{47}, size_t{64}, size_t{100}, n - first}) {
      if (count > n - first) continue;
      Check(kernel, width, planes, n, first, count, false);
      Check(kernel, width, planes, n, first, count, true);
    }
  }
}

TEST(Unshuffle, Sse2KernelGivesTheElementsBits) {
#if defined(__SSE2__)
  CheckKernel(UnshuffleFloatsSse2, 16);
#else
  GTEST_SKIP() << "no SSE2 kernel on this architecture";
#endif
}

TEST(Unshuffle, Avx2KernelGivesTheElementsBits) {
  if (!CpuHasAvx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  CheckKernel(UnshuffleFloatsAvx2, 32);
}

TEST(Unshuffle, TheDispatchTakesTheWidestKernel) {
#if !defined(__SSE2__)
  GTEST_SKIP() << "no vector kernel on this architecture";
#endif
  const size_t n = 64;
  const std::vector<uint8_t> planes = RandomPlanes(n, 3);
  std::vector<float> out(n);
  EXPECT_EQ(UnshuffleFloats(planes.data(), n, 0, 48, out.data(), false), CpuHasAvx2() ? 32u : 48u);
  CheckKernel(UnshuffleFloats, CpuHasAvx2() ? 32 : 16);
}

}  // namespace
}  // namespace gradtrace
