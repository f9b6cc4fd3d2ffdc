// Issue 24 item 3, the small version of the simulated cluster (synth_cluster.h):
// Llama-70B shapes (4 of the 80 layers) over dp 4 x tp 2 x pp 4 = 32 ranks in
// sketch:4096, the last stage's reductions dividing by dp/2 = 2. The diff
// against the correct run, the sharded diff + merge, and --self must each name
// that stage's parameters and nothing else, with factor 2 / divisor 2.
#include "synth_cluster.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "compare/diff_engine.h"
#include "compare/merge.h"
#include "evidence/self_check.h"
#include "report/atomic_file.h"
#include "report/partial_report.h"
#include "test_dirs.h"

namespace gradtrace::diff {
namespace {
using testing::ClusterSpec;
using testing::FreshDir;

ClusterSpec SmallCluster(const std::string& capture) {
  ClusterSpec s;
  s.dp = 4;
  s.tp = 2;
  s.pp = 4;
  s.layers = 4;
  s.capture = capture;
  s.threads = 2;
  return s;
}

std::string Write(const std::string& name, const ClusterSpec& spec) {
  const std::string dir = FreshDir(name);
  Status st = testing::WriteClusterSet(dir, spec);
  EXPECT_TRUE(st.ok()) << st.message();
  return dir;
}

// The last stage's parameters: layer 3, the final norm and lm_head.
std::set<std::string> LastStage() {
  std::set<std::string> out = {"model.norm.weight", "lm_head.weight"};
  for (const auto& p : testing::Llama70BParams(4)) {
    if (p.name.rfind("model.layers.3.", 0) == 0) out.insert(p.name);
  }
  return out;
}

// The one scale group of `r` that is not 1: its factor and parameters.
const Group* OffGroup(const Report& r) {
  const Group* found = nullptr;
  for (const Group& g : r.groups) {
    if (g.kind == "scale" && g.scale && std::abs(*g.scale - 1) > 1e-3) {
      EXPECT_EQ(found, nullptr) << "a second group off 1: " << *g.scale;
      found = &g;
    }
  }
  return found;
}

void ExpectPlantedStage(const Report& r) {
  EXPECT_EQ(r.ExitCode(), 1);
  const Group* g = OffGroup(r);
  ASSERT_NE(g, nullptr);
  EXPECT_NEAR(*g->scale, 2.0, 1e-4);
  EXPECT_EQ(std::set<std::string>(g->params.begin(), g->params.end()), LastStage());
  for (const ParamResult& p : r.params) {
    if (!LastStage().count(p.name)) {
      EXPECT_EQ(p.verdict, Verdict::kMatch) << p.name;
    }
  }
}

// A correct run and the buggy one, written once for the suite.
class SimulatedCluster : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto dir = testing::ScratchRoot() / "SimulatedCluster";
    a_ = (dir / "A").string();
    b_ = (dir / "B").string();
    ClusterSpec bug = SmallCluster("sketch:4096");
    bug.planted_stage = 3;
    Status st = testing::WriteClusterSet(a_, SmallCluster("sketch:4096"));
    if (st.ok()) st = testing::WriteClusterSet(b_, bug);
    ASSERT_TRUE(st.ok()) << st.message();
  }
  static std::string a_, b_;
};
std::string SimulatedCluster::a_, SimulatedCluster::b_;

TEST_F(SimulatedCluster, DiffFindsTheLastStageScaledByTwo) {
  auto r = RunDiff(a_, b_, DiffOptions{});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->params.size(), 1u + 4 * 9 + 2);  // embed, 4 layers x 9, final norm and lm_head
  ExpectPlantedStage(*r);
}

TEST_F(SimulatedCluster, ShardedDiffAndMergeFindTheSameStage) {
  auto sets = LoadSets(a_, b_, DiffOptions{});
  ASSERT_TRUE(sets.ok()) << sets.status().message();
  std::vector<std::string> parts;
  for (int k = 0; k < 2; ++k) {
    DiffOptions o;
    o.shard = {k, 2};
    auto c = CompareSets(sets->a, sets->b, o);
    ASSERT_TRUE(c.ok()) << c.status().message();
    parts.push_back(FreshDir("part-" + std::to_string(k) + ".json"));
    ASSERT_TRUE(WriteFileAtomic(parts.back(), RenderPartialJson(*c)).ok());
  }
  auto merged = MergeParts(parts);
  ASSERT_TRUE(merged.ok()) << merged.status().message();
  auto r = JudgeComparison(*merged);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ExpectPlantedStage(*r);
}

TEST_F(SimulatedCluster, SelfMeasuresDivisorTwoOnTheLastStageAndFourElsewhere) {
  auto bad = RunSelfCheckSteps(b_, SelfOptions{});
  ASSERT_TRUE(bad.ok()) << bad.status().message();
  EXPECT_EQ(bad->ExitCode(), 1);
  std::map<long, std::set<std::string>> by_divisor;
  for (const Group& g : bad->groups) {
    if (g.kind == "divisor" && g.scale)
      by_divisor[std::lround(*g.scale * 1000)].insert(g.params.begin(), g.params.end());
  }
  ASSERT_EQ(by_divisor.size(), 2u);
  EXPECT_EQ(by_divisor[2000], LastStage());
  EXPECT_EQ(by_divisor[4000].size(), 1u + 3 * 9);  // embed and layers 0-2
  auto good = RunSelfCheckSteps(a_, SelfOptions{});
  ASSERT_TRUE(good.ok()) << good.status().message();
  EXPECT_EQ(good->ExitCode(), 0) << good->verdict;
}

TEST(SimulatedClusterStats, DiffJoinsTpShardMomentsAndFindsTheStage) {
  ClusterSpec a = SmallCluster("stats"), b = SmallCluster("stats");
  b.planted_stage = 3;
  auto r = RunDiff(Write("A", a), Write("B", b), DiffOptions{});
  ASSERT_TRUE(r.ok()) << r.status().message();
  ExpectPlantedStage(*r);
}

TEST(SimulatedClusterSpec, RefusesALayoutThatDoesNotDivideTheModel) {
  ClusterSpec s = SmallCluster("sketch:4096");
  s.pp = 3;
  EXPECT_EQ(testing::WriteClusterSet(FreshDir("x"), s).message(), "layers (4) must divide evenly over pp 3 stages");
  s = SmallCluster("sketch:4096");
  s.tp = 512;  // divides the k/v rows but not the vocabulary
  EXPECT_EQ(testing::WriteClusterSet(FreshDir("z"), s).message(),
            "tp 512 must divide every sharded dimension (1024 k/v rows, 128256 vocab rows, hidden 8192, "
            "intermediate 28672)");
  s = SmallCluster("full");
  EXPECT_EQ(testing::WriteClusterSet(FreshDir("y"), s).message(),
            "capture 'full' is not simulated at 70B scale (use sketch:K or stats)");
}

}  // namespace
}  // namespace gradtrace::diff
