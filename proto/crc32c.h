// CRC32C (Castagnoli, reflected polynomial 0x82F63B78) and LevelDB's masking.
// Frame checksums are stored masked so that a CRC computed over data that
// itself embeds CRCs does not degenerate (see LevelDB util/crc32c.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace gradtrace::crc32c {

// Returns the CRC32C of concat(A, data[0,n)) where init_crc is the CRC32C of A.
// Uses the CPU's CRC32C instruction (x86-64 SSE4.2) when it has one, else
// ExtendPortable; both give the same value.
uint32_t Extend(uint32_t init_crc, const void* data, size_t n);
// The table-driven software loop (slicing-by-8): the fallback, and the
// reference the hardware path is tested against.
uint32_t ExtendPortable(uint32_t init_crc, const void* data, size_t n);
// True when Extend runs on the CPU's CRC32C instruction.
bool HardwareAccelerated();
inline uint32_t Value(const void* data, size_t n) { return Extend(0, data, n); }

inline constexpr uint32_t kMaskDelta = 0xa282ead8u;

// Rotate right by 15 bits and add a constant.
inline uint32_t Mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + kMaskDelta; }
inline uint32_t Unmask(uint32_t masked) {
  uint32_t rot = masked - kMaskDelta;
  return (rot >> 17) | (rot << 15);
}

}  // namespace gradtrace::crc32c
