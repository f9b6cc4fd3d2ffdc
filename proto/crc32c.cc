// CRC32C: the CPU's instruction where there is one (x86-64 SSE4.2, chosen at
// run time, so one binary runs everywhere), else software slicing-by-8: eight
// 256-entry tables let the loop consume eight bytes per iteration.
#include "crc32c.h"

#include <array>
#include <cstring>

namespace gradtrace::crc32c {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables MakeTables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[0][i] = c;
  }
  // t[s][i] is the CRC of byte i followed by s zero bytes.
  for (uint32_t i = 0; i < 256; ++i) {
    for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
  return t;
}

constexpr Tables kTables = MakeTables();

}  // namespace

uint32_t ExtendPortable(uint32_t init_crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~init_crc;
  for (; n >= 8; n -= 8, p += 8) {
    // Little-endian load: the first byte lands in the low bits, as the
    // reflected CRC expects.
    uint32_t lo = static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
                  static_cast<uint32_t>(p[3]) << 24;
    lo ^= c;
    c = kTables[7][lo & 0xff] ^ kTables[6][(lo >> 8) & 0xff] ^ kTables[5][(lo >> 16) & 0xff] ^ kTables[4][lo >> 24] ^
        kTables[3][p[4]] ^ kTables[2][p[5]] ^ kTables[1][p[6]] ^ kTables[0][p[7]];
  }
  for (; n > 0; --n, ++p) c = (c >> 8) ^ kTables[0][(c ^ *p) & 0xff];
  return ~c;
}

#if defined(__x86_64__)
namespace {

// x^(8 * kStripe) mod P (reflected), the operator that advances a CRC register over kStripe zero bytes.
constexpr size_t kStripe = 4096;

// a * b mod P in the reflected representation (zlib's multmodp).
constexpr uint32_t MultModP(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// x^(8 n) mod P: x^8 (0x00800000 reflected) raised to the n-th power by squaring.
constexpr uint32_t ZerosOperator(size_t n) {
  uint32_t result = 1u << 31, square = 1u << 23;  // x^0 and x^8
  for (; n > 0; n >>= 1) {
    if (n & 1) result = MultModP(result, square);
    square = MultModP(square, square);
  }
  return result;
}
constexpr uint32_t kShift1 = ZerosOperator(kStripe), kShift2 = ZerosOperator(2 * kStripe);

// One dependency chain of 8-byte crc32 instructions runs at about 8 bytes per
// 3 cycles (the instruction's latency); three chains over three adjacent
// stripes keep the unit busy every cycle, and the register is linear, so the
// chains join by advancing the first two over the bytes that follow them.
__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t init_crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t c = ~init_crc;
  for (; n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0; --n, ++p) c = __builtin_ia32_crc32qi(c, *p);
  for (; n >= 3 * kStripe; n -= 3 * kStripe, p += 3 * kStripe) {
    uint64_t c1 = 0, c2 = 0;
    for (size_t i = 0; i < kStripe; i += 8) {
      uint64_t w0, w1, w2;
      std::memcpy(&w0, p + i, 8);
      std::memcpy(&w1, p + kStripe + i, 8);
      std::memcpy(&w2, p + 2 * kStripe + i, 8);
      c = __builtin_ia32_crc32di(c, w0);
      c1 = __builtin_ia32_crc32di(c1, w1);
      c2 = __builtin_ia32_crc32di(c2, w2);
    }
    c = MultModP(kShift2, static_cast<uint32_t>(c)) ^ MultModP(kShift1, static_cast<uint32_t>(c1)) ^
        static_cast<uint32_t>(c2);
  }
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = __builtin_ia32_crc32di(c, word);
  }
  for (; n > 0; --n, ++p) c = __builtin_ia32_crc32qi(static_cast<uint32_t>(c), *p);
  return ~static_cast<uint32_t>(c);
}

const bool kHaveSse42 = __builtin_cpu_supports("sse4.2");

}  // namespace

bool HardwareAccelerated() { return kHaveSse42; }

uint32_t Extend(uint32_t init_crc, const void* data, size_t n) {
  return kHaveSse42 ? ExtendSse42(init_crc, data, n) : ExtendPortable(init_crc, data, n);
}
#else
bool HardwareAccelerated() { return false; }
uint32_t Extend(uint32_t init_crc, const void* data, size_t n) { return ExtendPortable(init_crc, data, n); }
#endif

}  // namespace gradtrace::crc32c
