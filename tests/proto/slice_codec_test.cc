// Slices in every mode and dtype, byte-shuffle, capture modes, fingerprints.
#include "slice_codec.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "test_util.h"

namespace gradtrace {
namespace {

constexpr pb::DType kAllDTypes[] = {pb::FP32, pb::FP16, pb::BF16, pb::FP64};

// Element bytes covering the awkward values of each dtype: +-0, +-Inf, quiet
// and signalling NaN with payload, smallest/largest subnormal and normal, and
// ordinary values.
std::string SpecialBytes(pb::DType t) {
  std::string out;
  auto put = [&out](auto bits) { out.append(reinterpret_cast<const char*>(&bits), sizeof bits); };
  switch (t) {
    case pb::FP32:
      for (uint32_t b : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00001u, 0x7f800001u, 0x00000001u,
                         0x007fffffu, 0x00800000u, 0x7f7fffffu, 0x3f800000u, 0xbdcccccdu})
        put(b);
      break;
    case pb::FP16:
      for (uint16_t b :
           {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e01, 0x7c01, 0x0001, 0x03ff, 0x0400, 0x7bff, 0x3c00, 0xae66})
        put(b);
      break;
    case pb::BF16:
      for (uint16_t b :
           {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc1, 0x7f81, 0x0001, 0x007f, 0x0080, 0x7f7f, 0x3f80, 0xbdcd})
        put(b);
      break;
    case pb::FP64:
      for (uint64_t b : {0x0ull, 0x8000000000000000ull, 0x7ff0000000000000ull, 0xfff0000000000000ull,
                         0x7ff8000000000001ull, 0x7ff0000000000001ull, 0x1ull, 0x000fffffffffffffull,
                         0x0010000000000000ull, 0x7fefffffffffffffull, 0x3ff0000000000000ull, 0xbfb999999999999aull})
        put(b);
      break;
    default:
      break;
  }
  return out;
}

pb::ParamInfo ParamOf(int64_t numel, pb::DType t) { return testing::Param(0, "w", {numel}, t); }

TEST(SliceCodec, FullRoundTripIsByteExactForEveryDType) {
  for (pb::DType t : kAllDTypes) {
    const std::string bytes = SpecialBytes(t);
    const int64_t n = static_cast<int64_t>(bytes.size() / DTypeSize(t));
    ASSERT_EQ(12, n);
    const pb::Slice s = MakeSlice(ParamOf(n + 5, t), 5, n, t, bytes.data(), CaptureMode{});
    EXPECT_TRUE(s.full().shuffled());
    EXPECT_NE(bytes, s.full().data()) << "stored shuffled";
    // Through the wire too.
    pb::Slice parsed;
    ASSERT_TRUE(parsed.ParseFromString(s.SerializeAsString()));
    auto back = DecodeFullBytes(parsed);
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_EQ(bytes, *back) << DTypeName(t);
    auto values = DecodeFullValues(parsed);
    ASSERT_TRUE(values.ok());
    ASSERT_EQ(static_cast<size_t>(n), values->size());
    for (int64_t i = 0; i < n; ++i) {
      const double want = ElementToDouble(t, reinterpret_cast<const uint8_t*>(bytes.data()) + i * DTypeSize(t));
      EXPECT_TRUE(std::bit_cast<uint64_t>(want) == std::bit_cast<uint64_t>((*values)[i]) ||
                  (std::isnan(want) && std::isnan((*values)[i])))
          << DTypeName(t) << " element " << i;
    }
    EXPECT_TRUE(std::signbit((*values)[1]));  // -0 stays -0
  }
}

TEST(SliceCodec, SketchRoundTripForEveryDType) {
  for (pb::DType t : kAllDTypes) {
    const std::string bytes = SpecialBytes(t);
    const int64_t n = static_cast<int64_t>(bytes.size() / DTypeSize(t));
    const pb::ParamInfo p = ParamOf(n, t);
    const pb::Slice s = MakeSlice(p, 0, n, t, bytes.data(), CaptureMode{CaptureMode::Kind::kSketch, 100});
    ASSERT_EQ(n, s.sketch().positions_size()) << "k > numel keeps every element";
    EXPECT_EQ(100, s.sketch().k());
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(i, s.sketch().positions(i));
      // The value is the exact widening: narrowing it back gives the same bytes.
      uint8_t back[8];
      DoubleToElement(t, s.sketch().values(i), back);
      EXPECT_EQ(0, std::memcmp(back, bytes.data() + i * DTypeSize(t), DTypeSize(t))) << DTypeName(t) << " " << i;
    }
  }
}

TEST(SliceCodec, StatsForEveryDType) {
  for (pb::DType t : kAllDTypes) {
    const std::string bytes = SpecialBytes(t);
    const int64_t n = static_cast<int64_t>(bytes.size() / DTypeSize(t));
    const pb::Slice s = MakeSlice(ParamOf(n, t), 0, n, t, bytes.data(), CaptureMode{CaptureMode::Kind::kStats, 0});
    const pb::StatsPayload& st = s.stats();
    EXPECT_EQ(4, st.nonfinite()) << DTypeName(t);  // +Inf, -Inf, two NaNs
    EXPECT_EQ(8, st.count());
    double sum = 0, sq = 0, mx = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double v = ElementToDouble(t, reinterpret_cast<const uint8_t*>(bytes.data()) + i * DTypeSize(t));
      if (!std::isfinite(v)) continue;
      sum += v;
      sq += v * v;
      mx = std::max(mx, std::fabs(v));
    }
    EXPECT_DOUBLE_EQ(sum, st.sum());
    EXPECT_DOUBLE_EQ(sq, st.sum_sq());
    EXPECT_EQ(mx, st.abs_max());
  }
}

TEST(SliceCodec, StatsClosedForm) {
  std::vector<double> v(1000);
  for (int i = 0; i < 1000; ++i) v[i] = i + 1;  // 1..1000
  const pb::Slice s =
      MakeSlice(ParamOf(1000, pb::FP64), 0, 1000, pb::FP64, v.data(), CaptureMode{CaptureMode::Kind::kStats, 0});
  EXPECT_EQ(1000, s.stats().count());
  EXPECT_EQ(500500.0, s.stats().sum());
  EXPECT_EQ(1000.0 * 1001 * 2001 / 6, s.stats().sum_sq());
  EXPECT_EQ(1000.0, s.stats().abs_max());
  EXPECT_EQ(0, s.stats().nonfinite());
}

// Regression: the compensated summation turned a sum of squares that
// overflows (fp64 max squared) into NaN instead of +Inf.
TEST(SliceCodec, StatsSumOfSquaresOverflowsToInfNotNan) {
  const double v[] = {1.0, std::numeric_limits<double>::max(), 2.0};
  const pb::Slice s = MakeSlice(ParamOf(3, pb::FP64), 0, 3, pb::FP64, v, CaptureMode{CaptureMode::Kind::kStats, 0});
  EXPECT_EQ(std::numeric_limits<double>::infinity(), s.stats().sum_sq());
  EXPECT_EQ(std::numeric_limits<double>::max(), s.stats().sum());
  EXPECT_EQ(0, s.stats().nonfinite());
}

TEST(SliceCodec, ByteShuffleLayout) {
  const uint8_t in[] = {0x10, 0x11, 0x12, 0x13, 0x20, 0x21, 0x22, 0x23, 0x30, 0x31, 0x32, 0x33};
  uint8_t out[12], back[12];
  ByteShuffle(in, 3, 4, out);
  const uint8_t want[] = {0x10, 0x20, 0x30, 0x11, 0x21, 0x31, 0x12, 0x22, 0x32, 0x13, 0x23, 0x33};
  EXPECT_EQ(0, std::memcmp(want, out, 12));
  ByteUnshuffle(out, 3, 4, back);
  EXPECT_EQ(0, std::memcmp(in, back, 12));
}

TEST(SliceCodec, UnshuffledFullPayloadDecodes) {
  pb::Slice s;
  s.set_dtype(pb::FP16);
  s.set_count(2);
  s.mutable_full()->set_data(std::string("\x00\x3c\x00\xc0", 4));
  auto v = DecodeFullValues(s);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ((std::vector<double>{1.0, -2.0}), *v);
}

TEST(SliceCodec, DecodeRefusesWrongSizes) {
  pb::Slice s = MakeSlice(ParamOf(4, pb::FP32), 0, 4, pb::FP32, std::vector<float>(4, 1.0f).data(), CaptureMode{});
  s.set_count(5);
  EXPECT_EQ(Status::Code::kCorruption, DecodeFullBytes(s).status().code());
  EXPECT_NE(std::string::npos, DecodeFullBytes(s).status().message().find("expected 5 x 4 bytes, got 16"));
  s.set_count(-1);
  EXPECT_FALSE(DecodeFullValues(s).ok());
  s.set_count(std::numeric_limits<int64_t>::max() / 2);  // count * width overflows size_t arithmetic
  EXPECT_FALSE(DecodeFullBytes(s).ok());
  s.set_count(4);
  s.set_dtype(pb::DTYPE_UNSPECIFIED);
  EXPECT_FALSE(DecodeFullBytes(s).ok());
  pb::Slice stats;
  stats.mutable_stats();
  EXPECT_EQ(Status::Code::kInvalidArgument, DecodeFullBytes(stats).status().code());
}

// A window of a parameter (issue 24 item 2) decodes part of a slice: the same values as the whole, shuffled or not.
TEST(SliceCodec, FullValueRangeIsThatPartOfTheWhole) {
  for (pb::DType t : kAllDTypes) {
    for (bool shuffled : {true, false}) {
      const std::string bytes = SpecialBytes(t);
      const int64_t n = 12;
      pb::Slice s = MakeSlice(ParamOf(n, t), 0, n, t, bytes.data(), CaptureMode{});
      if (!shuffled) s.mutable_full()->set_data(bytes), s.mutable_full()->set_shuffled(false);
      std::vector<double> whole(n, 0.0);
      ASSERT_TRUE(AddFullValues(s, whole.data()).ok());
      std::vector<double> part(5, 1.0);  // added onto, as AddFullValues adds
      ASSERT_TRUE(AddFullValueRange(s, 4, 5, part.data()).ok());
      for (int64_t i = 0; i < 5; ++i) {
        const double want = whole[4 + i] + 1.0;
        EXPECT_TRUE(want == part[i] || (std::isnan(want) && std::isnan(part[i]))) << DTypeName(t) << " element " << i;
      }
      EXPECT_EQ(Status::Code::kInvalidArgument, AddFullValueRange(s, 8, 5, part.data()).code());
      EXPECT_EQ(Status::Code::kInvalidArgument, AddFullValueRange(s, -1, 2, part.data()).code());
    }
  }
}

// Shuffled fp32 into floats goes 16 elements at a time (SSE2 unpacks) and the rest one by one: every range of a
// slice of the special values and random ones, copied and added, must hold the very bits of the stored elements
// (NaN payloads included) -- against the unshuffled bytes, not the decoder.
TEST(SliceCodec, Fp32RangesIntoFloatsAreTheStoredBits) {
  const std::string special = SpecialBytes(pb::FP32);
  std::string bytes;
  while (bytes.size() < 4 * 61) bytes += special;
  const std::vector<float> random = testing::Floats(40, 3);
  bytes.append(reinterpret_cast<const char*>(random.data()), random.size() * 4);
  const int64_t n = static_cast<int64_t>(bytes.size() / 4);
  const pb::Slice s = MakeSlice(ParamOf(n, pb::FP32), 0, n, pb::FP32, bytes.data(), CaptureMode{});
  ASSERT_TRUE(s.full().shuffled());
  auto bits = [](float f) { return std::bit_cast<uint32_t>(f); };
  for (int64_t first = 0; first < 20; ++first) {
    for (int64_t count = 0; first + count <= n; count += (count < 40 ? 1 : 7)) {
      std::vector<float> copy(static_cast<size_t>(count), 5.0f);
      ASSERT_TRUE(CopyFullValueRange(s, s.full().data(), first, count, copy.data()).ok());
      std::vector<float> added(static_cast<size_t>(count), 0.5f);
      ASSERT_TRUE(AddFullValueRange(s, first, count, added.data()).ok());
      for (int64_t i = 0; i < count; ++i) {
        uint32_t want;
        std::memcpy(&want, bytes.data() + 4 * (first + i), 4);
        ASSERT_EQ(bits(copy[i]), want) << first << " +" << count << " element " << i;
        const float sum = std::bit_cast<float>(want) + 0.5f;
        ASSERT_TRUE(bits(added[i]) == bits(sum) || (std::isnan(sum) && std::isnan(added[i])))
            << first << " +" << count << " element " << i;
      }
    }
  }
}

TEST(SliceCodec, ParseCaptureMode) {
  auto full = ParseCaptureMode("full");
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(CaptureMode::Kind::kFull, full->kind);
  auto stats = ParseCaptureMode("stats");
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(CaptureMode::Kind::kStats, stats->kind);
  auto sk = ParseCaptureMode("sketch:4096");
  ASSERT_TRUE(sk.ok());
  EXPECT_EQ(CaptureMode::Kind::kSketch, sk->kind);
  EXPECT_EQ(4096, sk->k);
  EXPECT_EQ("sketch:4096", sk->ToString());
  EXPECT_EQ("full", full->ToString());
  EXPECT_EQ("stats", stats->ToString());
  for (const char* bad : {"", "Full", "sketch", "sketch:", "sketch:0", "sketch:-3", "sketch:+3", "sketch:12x",
                          "sketch:99999999999", "stat", "sketch: 5"}) {
    auto m = ParseCaptureMode(bad);
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_EQ(Status::Code::kInvalidArgument, m.status().code());
    EXPECT_NE(std::string::npos, m.status().message().find(std::string("'") + bad + "'")) << m.status().message();
  }
  EXPECT_NE(std::string::npos,
            ParseCaptureMode("x").status().message().find("expected full, sketch:K (K > 0) or stats"));
}

TEST(Fingerprint, StableAndSensitiveToNameShapeDType) {
  const pb::RunInfo base = testing::SmallRun();
  const std::string fp = ModelFingerprint(base);
  EXPECT_EQ(16u, fp.size());
  EXPECT_EQ(fp, ModelFingerprint(base));
  EXPECT_EQ("3e468e2df47f0181", fp);  // pinned: FORMAT.md's worked example

  pb::RunInfo other_config = base;  // fingerprint covers the model only
  other_config.mutable_config()->set_sp(8);
  other_config.set_rank(3);
  EXPECT_EQ(fp, ModelFingerprint(other_config));

  pb::RunInfo renamed = base;
  renamed.mutable_params(0)->set_name("embed.weights");
  pb::RunInfo reshaped = base;  // same numel, different shape
  reshaped.mutable_params(0)->set_shape(0, 8);
  reshaped.mutable_params(0)->set_shape(1, 16);
  pb::RunInfo retyped = base;
  retyped.mutable_params(1)->set_dtype(pb::FP16);
  pb::RunInfo reordered = base;
  reordered.mutable_params()->SwapElements(0, 1);
  pb::RunInfo fewer = base;
  fewer.mutable_params()->RemoveLast();
  // Length prefixes keep ("ab", "c") and ("a", "bc") apart.
  pb::RunInfo split1 = base, split2 = base;
  split1.mutable_params(0)->set_name("ab");
  split1.mutable_params(1)->set_name("c");
  split2.mutable_params(0)->set_name("a");
  split2.mutable_params(1)->set_name("bc");
  for (const pb::RunInfo* r : {&renamed, &reshaped, &retyped, &reordered, &fewer}) EXPECT_NE(fp, ModelFingerprint(*r));
  EXPECT_NE(ModelFingerprint(split1), ModelFingerprint(split2));
}

}  // namespace
}  // namespace gradtrace
