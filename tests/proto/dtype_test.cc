// Element conversions: exact widening, round-to-nearest-even narrowing.
#include "dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

namespace gradtrace {
namespace {

uint16_t Narrow(pb::DType t, double v) {
  uint8_t b[2];
  DoubleToElement(t, v, b);
  uint16_t out;
  std::memcpy(&out, b, 2);
  return out;
}
double Widen(pb::DType t, uint16_t bits) {
  uint8_t b[2];
  std::memcpy(b, &bits, 2);
  return ElementToDouble(t, b);
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(4u, DTypeSize(pb::FP32));
  EXPECT_EQ(2u, DTypeSize(pb::FP16));
  EXPECT_EQ(2u, DTypeSize(pb::BF16));
  EXPECT_EQ(8u, DTypeSize(pb::FP64));
  EXPECT_EQ(0u, DTypeSize(pb::DTYPE_UNSPECIFIED));
  for (pb::DType t : {pb::FP32, pb::FP16, pb::BF16, pb::FP64}) {
    pb::DType parsed = pb::DTYPE_UNSPECIFIED;
    ASSERT_TRUE(ParseDType(DTypeName(t), &parsed)) << DTypeName(t);
    EXPECT_EQ(t, parsed);
  }
  pb::DType parsed;
  EXPECT_FALSE(ParseDType("int8", &parsed));
  EXPECT_STREQ("unknown", DTypeName(pb::DTYPE_UNSPECIFIED));
}

// Issue 21: one table, one canonical spelling per dtype (the enum name FORMAT.md 4.4 and proto JSON use), the
// aliases in one list. C++ knew fp32/float32 only, Python also FP32, half and double.
TEST(DType, OneCanonicalNameAndItsAliases) {
  for (const DTypeInfo& row : DTypes()) {
    EXPECT_EQ(pb::DType_Name(row.dtype), row.name);
    EXPECT_STREQ(row.name, DTypeName(row.dtype));
    EXPECT_EQ(DTypeSize(row.dtype), row.size);
    EXPECT_EQ(&row, FindDType(row.dtype));
    EXPECT_FALSE(DTypeAliases(row.dtype).empty()) << row.name;
    for (const std::string& alias : DTypeAliases(row.dtype)) {
      pb::DType parsed = pb::DTYPE_UNSPECIFIED;
      ASSERT_TRUE(ParseDType(alias, &parsed)) << alias;
      EXPECT_EQ(row.dtype, parsed) << alias;
    }
  }
  EXPECT_EQ(4u, DTypes().size());
  EXPECT_EQ(nullptr, FindDType(pb::DTYPE_UNSPECIFIED));
  EXPECT_EQ(nullptr, FindDType(static_cast<pb::DType>(99)));
  const struct {
    const char* spelling;
    const char* canonical;
  } cases[] = {{"FP32", "FP32"},    {"fp32", "FP32"},     {"float32", "FP32"},  {"Float32", "FP32"}, {"FP16", "FP16"},
               {"fp16", "FP16"},    {"float16", "FP16"},  {"half", "FP16"},     {"HALF", "FP16"},    {"BF16", "BF16"},
               {"bf16", "BF16"},    {"bfloat16", "BF16"}, {"BFloat16", "BF16"}, {"FP64", "FP64"},    {"fp64", "FP64"},
               {"float64", "FP64"}, {"double", "FP64"}};
  for (const auto& c : cases) {
    pb::DType parsed = pb::DTYPE_UNSPECIFIED;
    ASSERT_TRUE(ParseDType(c.spelling, &parsed)) << c.spelling;
    EXPECT_STREQ(c.canonical, DTypeName(parsed)) << c.spelling;
  }
  for (const char* refused : {"", "int8", "fp8", "float", "fp 32", "fp32 ", "DTYPE_UNSPECIFIED", "unknown"}) {
    pb::DType parsed = pb::BF16;
    EXPECT_FALSE(ParseDType(refused, &parsed)) << refused;
    EXPECT_EQ(pb::BF16, parsed) << refused;  // untouched
  }
  EXPECT_EQ("FP32, FP16, BF16 or FP64", DTypeNamesInWords());
}

// Every one of the 65536 bit patterns widens to double and narrows back to
// itself, NaN payloads included: the widening is exact.
TEST(DType, Fp16AndBf16AllBitPatternsRoundTrip) {
  for (pb::DType t : {pb::FP16, pb::BF16}) {
    for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
      ASSERT_EQ(bits, Narrow(t, Widen(t, static_cast<uint16_t>(bits)))) << DTypeName(t) << " " << bits;
    }
  }
}

TEST(DType, Fp16KnownValues) {
  EXPECT_EQ(1.0, Widen(pb::FP16, 0x3c00));
  EXPECT_EQ(-2.0, Widen(pb::FP16, 0xc000));
  EXPECT_EQ(65504.0, Widen(pb::FP16, 0x7bff));
  EXPECT_EQ(std::ldexp(1.0, -24), Widen(pb::FP16, 0x0001));  // smallest subnormal
  EXPECT_EQ(std::ldexp(1023.0, -24), Widen(pb::FP16, 0x03ff));
  EXPECT_TRUE(std::signbit(Widen(pb::FP16, 0x8000)));
  EXPECT_EQ(0.0, Widen(pb::FP16, 0x8000));
  EXPECT_EQ(std::numeric_limits<double>::infinity(), Widen(pb::FP16, 0x7c00));
  EXPECT_TRUE(std::isnan(Widen(pb::FP16, 0x7e00)));
  EXPECT_EQ(0x7c00, Narrow(pb::FP16, 65520.0));  // halfway to 2^16 rounds up to Inf
  EXPECT_EQ(0x7bff, Narrow(pb::FP16, 65519.99));
  EXPECT_EQ(0x7c00, Narrow(pb::FP16, 1e300));
  EXPECT_EQ(0xfc00, Narrow(pb::FP16, -std::numeric_limits<double>::infinity()));
  EXPECT_EQ(0x0000, Narrow(pb::FP16, std::ldexp(1.0, -25)));  // half the smallest subnormal: ties to even (0)
  EXPECT_EQ(0x0001, Narrow(pb::FP16, std::ldexp(1.5, -25)));
  EXPECT_EQ(0x0002, Narrow(pb::FP16, std::ldexp(3.0, -25)));     // 1.5 ulp ties to even (2)
  EXPECT_EQ(0x0400, Narrow(pb::FP16, std::ldexp(1023.5, -24)));  // subnormal rounds up into the normals
  EXPECT_EQ(0x8000, Narrow(pb::FP16, -1e-300));
  EXPECT_EQ(0x0000, Narrow(pb::FP16, std::numeric_limits<double>::denorm_min()));
}

TEST(DType, RoundToNearestEvenAtMidpoints) {
  // 1 + 2^-11 is halfway between fp16 1.0 (0x3c00, even) and 1 + 2^-10 (0x3c01).
  EXPECT_EQ(0x3c00, Narrow(pb::FP16, 1.0 + std::ldexp(1.0, -11)));
  EXPECT_EQ(0x3c02, Narrow(pb::FP16, 1.0 + 3 * std::ldexp(1.0, -11)));  // halfway 0x3c01/0x3c02 -> even
  EXPECT_EQ(0x3c01, Narrow(pb::FP16, 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)));  // just above half
  // bf16: 1 + 2^-8 is halfway between 0x3f80 and 0x3f81.
  EXPECT_EQ(0x3f80, Narrow(pb::BF16, 1.0 + std::ldexp(1.0, -8)));
  EXPECT_EQ(0x3f82, Narrow(pb::BF16, 1.0 + 3 * std::ldexp(1.0, -8)));
}

// Regression: narrowing double -> fp32 -> bf16 rounds twice. 1 + 2^-8 + 2^-30
// is just above the bf16 midpoint, so it must round up, but via fp32 it first
// becomes exactly the midpoint and then ties to even (down).
TEST(DType, Bf16NarrowsFromDoubleWithoutDoubleRounding) {
  const double v = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);
  EXPECT_EQ(0x3f81, Narrow(pb::BF16, v));
}

TEST(DType, Bf16AgreesWithFp32TruncationRules) {
  EXPECT_EQ(0x3f80, Narrow(pb::BF16, 1.0));
  EXPECT_EQ(0x7f80, Narrow(pb::BF16, 3.5e38));                 // beyond bf16 max (3.39e38): Inf
  EXPECT_EQ(0x7f7f, Narrow(pb::BF16, 3.389e38));               // nearest is the bf16 max
  EXPECT_EQ(0x0001, Narrow(pb::BF16, std::ldexp(1.0, -133)));  // smallest bf16 subnormal
  EXPECT_EQ(std::ldexp(1.0, -133), Widen(pb::BF16, 0x0001));
  EXPECT_TRUE(std::isnan(Widen(pb::BF16, Narrow(pb::BF16, std::nan("")))));
  EXPECT_EQ(0xff80, Narrow(pb::BF16, -std::numeric_limits<double>::infinity()));
}

TEST(DType, NanWithPayloadBelowNarrowMantissaStaysNan) {
  // A double NaN whose payload lives only in the low bits must not become Inf.
  const double nan_low = std::bit_cast<double>(uint64_t{0x7ff0000000000001});
  EXPECT_EQ(0x7e00, Narrow(pb::FP16, nan_low));
  EXPECT_EQ(0x7fc0, Narrow(pb::BF16, nan_low));
}

TEST(DType, Fp32AndFp64ExactWidening) {
  const float f = std::nextafter(1.0f, 2.0f);
  uint8_t b[8];
  std::memcpy(b, &f, 4);
  EXPECT_EQ(static_cast<double>(f), ElementToDouble(pb::FP32, b));
  const double d = std::nextafter(1.0, 2.0);
  DoubleToElement(pb::FP64, d, b);
  EXPECT_EQ(d, ElementToDouble(pb::FP64, b));
  DoubleToElement(pb::FP32, 1.0 + std::ldexp(1.0, -24), b);  // fp32 midpoint ties to even
  float back;
  std::memcpy(&back, b, 4);
  EXPECT_EQ(1.0f, back);
}

}  // namespace
}  // namespace gradtrace

namespace gradtrace {
namespace {

// The bitwise fp32 narrowing agrees with the hardware's round-to-nearest-even
// conversion on random doubles across the whole fp32 range, subnormals included.
TEST(DType, Fp32NarrowingMatchesHardware) {
  std::mt19937_64 gen(42);
  for (int i = 0; i < 200000; ++i) {
    const uint64_t bits = gen();
    // Exponents around the fp32 range: [-160, 140).
    const int e = static_cast<int>(bits % 300) - 160;
    const double v = std::ldexp(1.0 + static_cast<double>(bits >> 12) * 0x1p-52, e) * ((bits & 1) ? -1 : 1);
    const float hw = static_cast<float>(v);
    uint8_t b[4];
    DoubleToElement(pb::FP32, v, b);
    uint32_t ours, want;
    std::memcpy(&ours, b, 4);
    std::memcpy(&want, &hw, 4);
    ASSERT_EQ(want, ours) << v;
  }
}

}  // namespace
}  // namespace gradtrace
