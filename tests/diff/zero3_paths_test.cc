// Issue 21: ZeRO-3's reduction path is chosen by one rule (semantics/reduction_path.h). The synthetic traces used
// to reduce-scatter every ZeRO-3 bucket whatever the recorded settings; they now take the path gradtrace-train's
// reducer and DeepSpeed take, so the diff is tested against what capture records.
#include <gtest/gtest.h>

#include <map>

#include "compare/diff_engine.h"
#include "compare/step_table.h"
#include "evidence/self_check.h"
#include "report/report.h"
#include "test_dirs.h"

namespace gradtrace::diff {
namespace {
using testing::Reference;
using testing::Synth;
using testing::SynthSpec;

// sp=2 under DeepSpeed 0.19.8's ZeRO-3 with the loss, 1000-element buckets: the default model's six
// 1024-element matrices sit alone in buckets above the size, the eight smaller parameters in buckets within it.
SynthSpec Zero3Sp2(bool reduce_scatter) {
  SynthSpec s = testing::Config(1, 2, 3, "deepspeed@0.19.8", "local-mean");
  s.bucket_elems = 1000;
  s.zero_reduce_scatter = reduce_scatter;
  return s;
}

std::map<double, int> CountsByScale(const Report& r) {
  std::map<double, int> out;
  for (const Group& g : r.groups) {
    if (g.scale) out[*g.scale > 1.5 ? 2.0 : 1.0] += g.count;
  }
  return out;
}

// docs/studies/ds5248.md "One run, two contracts" (measured on 0.19.8, sp2-rsoff-b2000): with reduce_scatter false the
// parameters within a bucket are summed over the SP ranks (2.000 with `loss`), those above it averaged (1.000).
TEST(Zero3Paths, WithoutReduceScatterSmallBucketsAllReduceAndLargeOnesReduceScatter) {
  const std::string a = Synth("ref", Reference());
  DiffOptions o;
  auto mixed = RunDiffSteps(a, Synth("z3-rsoff", Zero3Sp2(false)), o);
  ASSERT_TRUE(mixed.ok()) << mixed.status().message();
  EXPECT_EQ((std::map<double, int>{{1.0, 6}, {2.0, 8}}), CountsByScale(*mixed)) << mixed->summary;
  // --self measures the two divisors: world / sp = 1 on the all-reduce path, world = 2 on the reduce-scatter path.
  auto self = RunSelfCheck(Synth("z3-rsoff-self", Zero3Sp2(false)), SelfOptions{});
  ASSERT_TRUE(self.ok()) << self.status().message();
  EXPECT_EQ((std::map<double, int>{{1.0, 8}, {2.0, 6}}), CountsByScale(*self)) << self->summary;
  auto averaged = RunDiffSteps(a, Synth("z3-rs", Zero3Sp2(true)), o);
  ASSERT_TRUE(averaged.ok()) << averaged.status().message();
  EXPECT_EQ("match", averaged->verdict) << averaged->summary;
}

// contiguous_gradients false takes the reduce-scatter path whatever the size (sp2-rsoff-nocontig: 1.000).
TEST(Zero3Paths, WithoutContiguousGradientsEveryBucketReduceScatters) {
  SynthSpec b = Zero3Sp2(false);
  b.zero_contiguous_gradients = false;
  DiffOptions o;
  auto r = RunDiffSteps(Synth("ref", Reference()), Synth("z3-nocontig", b), o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ("match", r->verdict) << r->summary;
}

}  // namespace
}  // namespace gradtrace::diff
