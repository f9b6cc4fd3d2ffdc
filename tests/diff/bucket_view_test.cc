// --self's per-rank x per-bucket view (bucket_view.h) on synthetic sets: one
// cell per rank's POST_REDUCE record, the divisor of each reduction, replicated
// POST norms, and no accumulation claimed where FINAL is the micro-steps' sum;
// a two-set diff's view of each side (TraceSide.bucket_view).
#include "evidence/bucket_view.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "compare/diff_engine.h"
#include "evidence/self_check.h"
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

int Occurrences(const std::string& hay, const std::string& needle) {
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
  EXPECT_EQ(Occurrences(h, "<table id=\"bucket-view\">"), 1);
  EXPECT_EQ(Occurrences(h, "class=\"cell\""), static_cast<int>(r.bucket_view.size()));
  EXPECT_EQ(Occurrences(h, "data-verdict=\"ok\""), static_cast<int>(r.bucket_view.size()));
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
  EXPECT_EQ(Occurrences(RenderHtml(r), "data-verdict=\"wrong-divisor\""), static_cast<int>(r.bucket_view.size()));
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

// Each side's cells hold `divisor` against `expected` on `ranks` ranks, and are --self's cells of that side.
void ExpectSideView(const std::vector<BucketCell>& cells, const std::string& dir, double divisor, double expected,
                    int ranks, SelfVerdict verdict) {
  std::set<int> seen;
  for (const BucketCell& c : cells) {
    seen.insert(c.rank);
    EXPECT_NEAR(c.divisor, divisor, 1e-4 * divisor) << "rank " << c.rank << " bucket " << c.bucket;
    EXPECT_EQ(c.expected, expected);
    EXPECT_EQ(c.verdict, verdict);
  }
  EXPECT_EQ(static_cast<int>(seen.size()), ranks);
  Report self = Self(dir);
  ASSERT_EQ(cells.size(), self.bucket_view.size());
  for (size_t i = 0; i < cells.size(); ++i) {
    EXPECT_EQ(cells[i].rank, self.bucket_view[i].rank);
    EXPECT_EQ(cells[i].bucket, self.bucket_view[i].bucket);
    EXPECT_NEAR(cells[i].divisor, self.bucket_view[i].divisor, 1e-12 * divisor);
    EXPECT_NEAR(cells[i].post_norm, self.bucket_view[i].post_norm, 1e-12 * self.bucket_view[i].post_norm);
  }
}

// A two-set diff that writes HTML: A (dp 2, mean) divides by its group of 2 as
// needed; B (dp 2 x sp 2, ds-4530) by 4 / sp = 2 where its group of 4 needs 4
// (#5248). Both views are in the JSON under their side and drawn in the HTML.
TEST(BucketView, ATwoSetDiffCarriesEachSidesCells) {
  const std::string a = Synth("a", Config(2, 1, 0, "mean", "local-mean"));
  const std::string b = Synth("b", Config(2, 2, 0, "ds-4530", "local-mean"));
  DiffOptions o;
  o.bucket_view = true;
  auto r = RunDiff(a, b, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_FALSE(r->a.bucket_view.empty());
  ASSERT_FALSE(r->b.bucket_view.empty());
  ExpectSideView(r->a.bucket_view, a, 2.0, 2.0, 2, SelfVerdict::kOk);
  ExpectSideView(r->b.bucket_view, b, 2.0, 4.0, 4, SelfVerdict::kWrongDivisor);
  EXPECT_TRUE(r->bucket_view.empty());  // the top-level view is --self's

  auto j = nlohmann::json::parse(RenderJson(*r));
  EXPECT_EQ(j["schema_version"], kReportSchemaVersion);
  EXPECT_TRUE(j["bucket_view"].empty());
  for (const auto& [key, side] : {std::pair{"trace_a", &r->a}, std::pair{"trace_b", &r->b}}) {
    const auto& cells = j[key]["bucket_view"];
    ASSERT_EQ(cells.size(), side->bucket_view.size()) << key;
    for (size_t i = 0; i < cells.size(); ++i) {
      EXPECT_EQ(cells[i]["divisor"].get<double>(), side->bucket_view[i].divisor) << key << "[" << i << "]";
      EXPECT_EQ(cells[i]["expected"].get<double>(), side->bucket_view[i].expected) << key << "[" << i << "]";
      EXPECT_EQ(cells[i]["rank"].get<int>(), side->bucket_view[i].rank) << key << "[" << i << "]";
    }
  }
  const std::string h = RenderHtml(*r);
  EXPECT_EQ(Occurrences(h, "<table id=\"bucket-view-a\">"), 1);
  EXPECT_EQ(Occurrences(h, "<table id=\"bucket-view-b\">"), 1);
  EXPECT_EQ(Occurrences(h, "<table id=\"bucket-view\">"), 0);
  EXPECT_EQ(Occurrences(h, "class=\"cell\""), static_cast<int>(r->a.bucket_view.size() + r->b.bucket_view.size()));
  EXPECT_EQ(Occurrences(h, "data-verdict=\"wrong-divisor\""), static_cast<int>(r->b.bucket_view.size()));
  EXPECT_EQ(Occurrences(h, "<h3 class=\"side\">A (reference)"), 1);
  EXPECT_EQ(Occurrences(h, "<h3 class=\"side\">B"), 1);
  EXPECT_NE(h.find("ds-4530"), std::string::npos);
}

// Without HTML the diff skips the full --self passes: the arrays are there, empty.
TEST(BucketView, APlainDiffDoesNotComputeTheViews) {
  auto r = RunDiff(Synth("a", Config(2, 1, 0, "mean", "local-mean")),
                   Synth("b", Config(2, 2, 0, "ds-4530", "local-mean")), {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->a.bucket_view.empty());
  EXPECT_TRUE(r->b.bucket_view.empty());
  auto j = nlohmann::json::parse(RenderJson(*r));
  EXPECT_TRUE(j["trace_a"]["bucket_view"].is_array() && j["trace_a"]["bucket_view"].empty());
  EXPECT_TRUE(j["trace_b"]["bucket_view"].is_array() && j["trace_b"]["bucket_view"].empty());
  EXPECT_EQ(RenderHtml(*r).find("bucket-view"), std::string::npos);
}

// A side without PRE_REDUCE and POST_REDUCE has no view; the other side's is still drawn.
TEST(BucketView, ASideWithoutReductionsHasNoView) {
  auto spec = Config(2, 1, 0, "mean", "local-mean");
  spec.write_pre_post = false;
  DiffOptions o;
  o.bucket_view = true;
  auto r = RunDiff(Synth("a", spec), Synth("b", Config(2, 2, 0, "ds-4530", "local-mean")), o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->a.bucket_view.empty());
  EXPECT_FALSE(r->b.bucket_view.empty());
  const std::string h = RenderHtml(*r);
  EXPECT_EQ(Occurrences(h, "bucket-view-a"), 0);
  EXPECT_EQ(Occurrences(h, "<table id=\"bucket-view-b\">"), 1);
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
