#include "crc32c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace gradtrace::crc32c {
namespace {

// Vectors from RFC 3720 (iSCSI) B.4, as in LevelDB's crc32c_test.
TEST(Crc32c, StandardResults) {
  char buf[32];
  std::memset(buf, 0, sizeof buf);
  EXPECT_EQ(0x8a9136aau, Value(buf, sizeof buf));
  std::memset(buf, 0xff, sizeof buf);
  EXPECT_EQ(0x62a8ab43u, Value(buf, sizeof buf));
  for (int i = 0; i < 32; i++) buf[i] = static_cast<char>(i);
  EXPECT_EQ(0x46dd794eu, Value(buf, sizeof buf));
  for (int i = 0; i < 32; i++) buf[i] = static_cast<char>(31 - i);
  EXPECT_EQ(0x113fdb5cu, Value(buf, sizeof buf));
  EXPECT_EQ(0xe3069283u, Value("123456789", 9));
}

TEST(Crc32c, ExtendEqualsWholeAtEverySplit) {
  std::string s;
  for (int i = 0; i < 100; ++i) s.push_back(static_cast<char>(i * 37 + 11));
  const uint32_t whole = Value(s.data(), s.size());
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    EXPECT_EQ(whole, Extend(Value(s.data(), cut), s.data() + cut, s.size() - cut)) << cut;
  }
}

// Issue 12: the checksum runs on the CPU's CRC32C instruction; it must agree
// with the table loop at every length and alignment.
TEST(Crc32c, HardwareAgreesWithPortableAtEveryLengthAndAlignment) {
  std::string s;
  for (int i = 0; i < 300; ++i) s.push_back(static_cast<char>(i * 131 + 7));
  for (size_t start = 0; start < 9; ++start) {
    for (size_t n = 0; start + n <= s.size(); ++n) {
      ASSERT_EQ(ExtendPortable(0x12345678u, s.data() + start, n), Extend(0x12345678u, s.data() + start, n))
          << start << " " << n;
    }
  }
#if defined(__x86_64__)
  EXPECT_EQ(HardwareAccelerated(), static_cast<bool>(__builtin_cpu_supports("sse4.2")));
#endif
}

// The hardware loop runs three chains over 3 x 4096-byte stripes and joins
// them: lengths around one and several stripe groups, at every alignment, and
// a long buffer must give the table loop's value.
TEST(Crc32c, StripedChainsAgreeWithPortable) {
  std::string s;
  for (int i = 0; i < 5 * 12288 + 64; ++i) s.push_back(static_cast<char>((i * 2654435761u) >> 13));
  for (size_t start = 0; start < 9; ++start) {
    for (size_t n : {size_t{12287}, size_t{12288}, size_t{12289}, size_t{12295}, size_t{12296}, size_t{24576},
                     size_t{24583}, size_t{36864 + 4095}, s.size() - 9}) {
      ASSERT_EQ(ExtendPortable(0x9abcdef0u, s.data() + start, n), Extend(0x9abcdef0u, s.data() + start, n))
          << start << " " << n;
    }
  }
  std::string zeros(3 * 12288, '\0');
  EXPECT_EQ(ExtendPortable(0, zeros.data(), zeros.size()), Extend(0, zeros.data(), zeros.size()));
}

TEST(Crc32c, Mask) {
  const uint32_t crc = Value("foo", 3);
  EXPECT_NE(crc, Mask(crc));
  EXPECT_NE(crc, Mask(Mask(crc)));
  EXPECT_EQ(crc, Unmask(Mask(crc)));
  EXPECT_EQ(crc, Unmask(Unmask(Mask(Mask(crc)))));
}

}  // namespace
}  // namespace gradtrace::crc32c
