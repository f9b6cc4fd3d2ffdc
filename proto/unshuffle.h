// Shuffled fp32 payloads (four byte planes of n elements each, FORMAT.md 5)
// back into floats: the inner loop of every full-payload read. The vector
// kernels do the leading elements in whole vectors and return how many; the
// caller does the rest element by element. Both give PutElements' bits.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gradtrace {

// Elements [first, first + count) of the planes at `planes` into out[0, ...),
// or added to it (`add`): 16 at a time with SSE2 (every x86-64 has it; 0 elsewhere).
size_t UnshuffleFloatsSse2(const uint8_t* planes, size_t n, size_t first, size_t count, float* out, bool add);
// The same, 32 at a time with 32-byte vectors (unshuffle_avx2.cc): call only where CpuHasAvx2().
size_t UnshuffleFloatsAvx2(const uint8_t* planes, size_t n, size_t first, size_t count, float* out, bool add);
// The widest kernel this CPU runs.
size_t UnshuffleFloats(const uint8_t* planes, size_t n, size_t first, size_t count, float* out, bool add);

}  // namespace gradtrace
