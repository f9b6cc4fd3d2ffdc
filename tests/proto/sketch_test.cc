// Sketch positions: a keyed permutation evaluated at the first k indices.
#include "sketch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <vector>

#include "slice_codec.h"

namespace gradtrace {
namespace {

TEST(Sketch, Fnv1a64KnownValues) {
  // Published FNV-1a 64 test vectors.
  EXPECT_EQ(0xcbf29ce484222325ull, sketch::Fnv1a64(""));
  EXPECT_EQ(0xaf63dc4c8601ec8cull, sketch::Fnv1a64("a"));
  EXPECT_EQ(0x85944171f73967e8ull, sketch::Fnv1a64("foobar"));
}

// Pinned outputs: a second implementation (the Python twin) must reproduce
// these exactly; FORMAT.md quotes them.
TEST(Sketch, GoldenPositions) {
  EXPECT_EQ(0xe220a8397b1dcdafull, sketch::Mix64(sketch::kGoldenGamma));  // SplitMix64(seed 0), first output
  EXPECT_EQ((std::vector<int64_t>{48, 160, 234, 271, 450, 454, 716, 719}), SketchPositions("layer.0.weight", 1000, 8));
  EXPECT_EQ((std::vector<int64_t>{222764498418, 230128880928, 577012249972, 997781634402}),
            SketchPositions("embed.weight", 1000000000000, 4));
  EXPECT_EQ((std::vector<int64_t>{0, 1, 2}), SketchPositions("bias", 3, 10));
}

TEST(Sketch, CountRangeDistinctSorted) {
  for (int64_t numel : {1, 2, 3, 4, 5, 15, 16, 17, 1000, 65537}) {
    for (int32_t k : {1, 7, 64, 1000}) {
      const std::vector<int64_t> pos = SketchPositions("p", numel, k);
      ASSERT_EQ(static_cast<size_t>(std::min<int64_t>(k, numel)), pos.size()) << numel << " " << k;
      EXPECT_TRUE(std::is_sorted(pos.begin(), pos.end()));
      EXPECT_EQ(pos.end(), std::adjacent_find(pos.begin(), pos.end()));  // distinct
      EXPECT_GE(pos.front(), 0);
      EXPECT_LT(pos.back(), numel);
    }
  }
  EXPECT_TRUE(SketchPositions("p", 0, 5).empty());
  EXPECT_TRUE(SketchPositions("p", 10, 0).empty());
}

TEST(Sketch, PermutationIsABijection) {
  for (uint64_t n : {1ull, 2ull, 5ull, 16ull, 1000ull, 4097ull}) {
    const sketch::Permutation perm(sketch::Fnv1a64("w"), n);
    std::set<uint64_t> seen;
    for (uint64_t i = 0; i < n; ++i) seen.insert(perm(i));
    ASSERT_EQ(n, seen.size());
    EXPECT_EQ(n - 1, *seen.rbegin());
  }
}

TEST(Sketch, DeterministicAndKeyedByName) {
  EXPECT_EQ(SketchPositions("a.weight", 100000, 32), SketchPositions("a.weight", 100000, 32));
  EXPECT_NE(SketchPositions("a.weight", 100000, 32), SketchPositions("b.weight", 100000, 32));
  // Growing k keeps the earlier positions: the first k of one permutation.
  const auto small = SketchPositions("a.weight", 100000, 32);
  const auto big = SketchPositions("a.weight", 100000, 64);
  EXPECT_TRUE(std::includes(big.begin(), big.end(), small.begin(), small.end()));
}

TEST(Sketch, Spread) {
  // Positions of a large parameter are not clustered: each quarter of the
  // range gets between 15% and 35% of them.
  const auto pos = SketchPositions("spread", 1 << 20, 4096);
  int quarters[4] = {};
  for (int64_t p : pos) ++quarters[p >> 18];
  for (int q : quarters) {
    EXPECT_GT(q, 4096 * 15 / 100);
    EXPECT_LT(q, 4096 * 35 / 100);
  }
}

TEST(Sketch, HugeParamCostsOnlyK) {
  const auto start = std::chrono::steady_clock::now();
  const auto pos = SketchPositions("huge", 1000000000000, 1000);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(1000u, pos.size());
  EXPECT_LT(pos.back(), 1000000000000);
  EXPECT_LT(took, std::chrono::milliseconds(200));  // O(k): microseconds in practice
  // numel near 2^63 uses the 2^64 domain (h = 32).
  EXPECT_EQ(32u, sketch::Permutation(1, (uint64_t{1} << 63) + 5).half_bits());
  EXPECT_EQ(3u, SketchPositions("max", std::numeric_limits<int64_t>::max(), 3).size());
}

// The point of name-keyed positions: however a parameter is cut into slices
// (ranks, partitions, buckets), the union of the slices' sketches is the
// sketch of the whole parameter, with the same values.
TEST(Sketch, SameGlobalPositionsUnderAnySlicing) {
  pb::ParamInfo p;
  p.set_id(0);
  p.set_name("layers.3.mlp.weight");
  p.add_shape(997);
  p.add_shape(13);
  p.set_numel(997 * 13);
  std::vector<float> v(p.numel());
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.5f - 7.0f;
  const CaptureMode mode{CaptureMode::Kind::kSketch, 257};
  const pb::Slice whole = MakeSlice(p, 0, p.numel(), pb::FP32, v.data(), mode);
  ASSERT_EQ(257, whole.sketch().positions_size());
  for (const std::vector<int64_t>& cuts : std::vector<std::vector<int64_t>>{
           {0, 12961},
           {0, 1, 5000, 12961},
           {0, 1000, 2000, 3001, 7777, 9000, 12000, 12961},
       }) {
    std::vector<int64_t> positions;
    std::vector<double> values;
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      const pb::Slice s = MakeSlice(p, cuts[i], cuts[i + 1] - cuts[i], pb::FP32, v.data() + cuts[i], mode);
      positions.insert(positions.end(), s.sketch().positions().begin(), s.sketch().positions().end());
      values.insert(values.end(), s.sketch().values().begin(), s.sketch().values().end());
    }
    EXPECT_EQ(std::vector<int64_t>(whole.sketch().positions().begin(), whole.sketch().positions().end()), positions)
        << cuts.size() - 1 << " slices";
    EXPECT_EQ(std::vector<double>(whole.sketch().values().begin(), whole.sketch().values().end()), values);
  }
  for (int i = 0; i < whole.sketch().positions_size(); ++i) {
    EXPECT_EQ(v[whole.sketch().positions(i)], whole.sketch().values(i));
  }
}

}  // namespace
}  // namespace gradtrace
