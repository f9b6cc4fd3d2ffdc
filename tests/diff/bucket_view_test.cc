// --self's per-rank x per-bucket view (bucket_view.h) on synthetic sets: one
// cell per rank's POST_REDUCE record, the divisor of each reduction, replicated
// POST norms, and no accumulation claimed where FINAL is the micro-steps' sum.
#include "bucket_view.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "self_check.h"
#include "test_dirs.h"

namespace gradtrace::diff {
namespace {
using testing::Config;
using testing::Synth;

Report Self(const std::string& dir) {
  auto r = RunSelfCheck(dir, {});
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(*r) : Report{};
}

int Count(const std::string& hay, const std::string& needle) {
  int n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + needle.size())) ++n;
  return n;
}

TEST(BucketView, OneCellPerRankAndBucketWithTheGroupSizeAsDivisor) {
  Report r = Self(Synth("mean", Config(2, 2, 0, "mean", "local-mean")));
  std::map<int, std::set<int32_t>> buckets;  // rank -> buckets
  std::map<int32_t, double> post;            // bucket -> ||POST|| (replicas: the same on every rank)
  ASSERT_FALSE(r.bucket_view.empty());
  for (const BucketCell& c : r.bucket_view) {
    buckets[c.rank].insert(c.bucket);
    EXPECT_NEAR(c.divisor, 4.0, 1e-4);
    EXPECT_EQ(c.expected, 4.0);
    EXPECT_EQ(c.group_size, 4);
    EXPECT_EQ(c.verdict, SelfVerdict::kOk);
    EXPECT_FALSE(c.accumulates);
    EXPECT_LT(c.residual, 1e-6);
    EXPECT_GT(c.pre_norm, 0);
    if (post.count(c.bucket)) {
      EXPECT_NEAR(c.post_norm, post[c.bucket], 1e-12 * post[c.bucket]) << "bucket " << c.bucket;
    }
    post[c.bucket] = c.post_norm;
  }
  ASSERT_EQ(buckets.size(), 4u);  // world = dp x sp
  for (const auto& [rank, set] : buckets) EXPECT_EQ(set, buckets[0]) << "rank " << rank;
  EXPECT_EQ(r.bucket_view.size(), 4 * buckets[0].size());
  // Every parameter is in one bucket: the cells of one rank cover them all.
  int params = 0;
  for (const BucketCell& c : r.bucket_view) params += c.rank == 0 ? c.params : 0;
  EXPECT_EQ(params, 14);

  auto j = nlohmann::json::parse(RenderJson(r));
  ASSERT_EQ(j["bucket_view"].size(), r.bucket_view.size());
  EXPECT_EQ(j["bucket_view"][0]["divisor"].get<double>(), r.bucket_view[0].divisor);
  EXPECT_EQ(j["bucket_view"][0]["verdict"], "ok");
  std::string h = RenderHtml(r);
  EXPECT_EQ(Count(h, "<table id=\"bucket-view\">"), 1);
  EXPECT_EQ(Count(h, "class=\"cell\""), static_cast<int>(r.bucket_view.size()));
  EXPECT_EQ(Count(h, "data-verdict=\"ok\""), static_cast<int>(r.bucket_view.size()));
  EXPECT_NE(h.find("<span class=\"post\">" + FormatNumber(r.bucket_view[0].post_norm, 5) + "</span>"),
            std::string::npos);
}

TEST(BucketView, ZeroPartitionsAreJudgedPerReduction) {
  Report r = Self(Synth("ds", Config(2, 2, 2, "ds-4530", "local-mean")));
  ASSERT_FALSE(r.bucket_view.empty());
  for (const BucketCell& c : r.bucket_view) {
    EXPECT_NEAR(c.divisor, 2.0, 1e-4);  // dp only, where the group of 4 needs 4 (#5248)
    EXPECT_EQ(c.verdict, SelfVerdict::kWrongDivisor);
  }
  EXPECT_EQ(Count(RenderHtml(r), "data-verdict=\"wrong-divisor\""), static_cast<int>(r.bucket_view.size()));
}

TEST(BucketView, MicroStepsWhoseFinalIsTheirSumDoNotAccumulate) {
  auto spec = Config(2, 1, 0, "mean", "local-mean");
  spec.gas = 2;
  Report r = Self(Synth("gas2", spec));
  std::set<int32_t> micros;
  for (const BucketCell& c : r.bucket_view) {
    micros.insert(c.micro);
    EXPECT_FALSE(c.accumulates);
  }
  EXPECT_EQ(micros, (std::set<int32_t>{0, 1}));
  for (const Finding& f : r.findings) EXPECT_NE(f.kind, "accumulation") << f.message;
  EXPECT_EQ(r.verdict, "ok");
}

TEST(BucketView, FinishCellJudgesOneReduction) {
  CellSums s;
  s.ss = 16, s.sp = 8, s.pp = 4, s.pre_sq = 9, s.post_sq = 4, s.compared = 3, s.params = 1;  // P = S/2 exactly
  BucketCell c;
  c.expected = 2;
  BucketCell ok = FinishCell(s, 1e-5, 1e-4, c);
  EXPECT_EQ(ok.divisor, 2.0);
  EXPECT_EQ(ok.residual, 0.0);
  EXPECT_EQ(ok.pre_norm, 3.0);
  EXPECT_EQ(ok.post_norm, 2.0);
  EXPECT_EQ(ok.verdict, SelfVerdict::kOk);
  c.expected = 4;
  EXPECT_EQ(FinishCell(s, 1e-5, 1e-4, c).verdict, SelfVerdict::kWrongDivisor);
  s.pp = 5;  // P has a part that is no multiple of S
  EXPECT_EQ(FinishCell(s, 1e-5, 1e-4, c).verdict, SelfVerdict::kInconsistent);
  EXPECT_EQ(FinishCell(CellSums{}, 1e-5, 1e-4, c).verdict, SelfVerdict::kMissing);
}

}  // namespace
}  // namespace gradtrace::diff
