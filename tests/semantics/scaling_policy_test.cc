// Scaling policies and the DeepSpeed release table (semantics/scaling_policy.h,
// deepspeed_releases.h): each policy's divisor per reduction path, against the
// divisors measured on real DeepSpeed (docs/studies/ds5248.md). Moved from
// tests/capture/capture_unit_test.cc, which needs LibTorch.
#include "scaling_policy.h"

#include <gtest/gtest.h>

#include <string>

#include "deepspeed_releases.h"

namespace gradtrace::semantics {
namespace {

BucketContext Ctx(ReductionPath path, int g, int sp, bool moe = false) {
  BucketContext c;
  c.path = path;
  c.group_size = g;
  c.sp = sp;
  c.has_moe = moe;
  return c;
}

TEST(Scaling, NamedPolicyDivisors) {
  const auto E = ReductionPath::kEngineAllreduce, Z = ReductionPath::kZeroPartitioned;
  auto mean = ResolvePolicy("mean").value();
  auto sum = ResolvePolicy("sum").value();
  auto ds = ResolvePolicy("ds-4530").value();
  auto pre = ResolvePolicy("ds-pre-4957").value();
  EXPECT_DOUBLE_EQ(PlanBucketScaling(mean, Ctx(E, 8, 4)).Divisor(), 8);
  EXPECT_DOUBLE_EQ(PlanBucketScaling(mean, Ctx(Z, 8, 4)).Divisor(), 8);
  EXPECT_DOUBLE_EQ(PlanBucketScaling(sum, Ctx(Z, 8, 4)).Divisor(), 1);
  EXPECT_DOUBLE_EQ(PlanBucketScaling(ds, Ctx(E, 8, 4)).Divisor(), 2);
  EXPECT_DOUBLE_EQ(PlanBucketScaling(ds, Ctx(Z, 8, 4)).Divisor(), 2);
  EXPECT_DOUBLE_EQ(PlanBucketScaling(pre, Ctx(Z, 8, 4, false)).Divisor(), 2);
  EXPECT_DOUBLE_EQ(PlanBucketScaling(pre, Ctx(Z, 8, 4, true)).Divisor(), 4);  // divided twice
}

TEST(Scaling, PredivideFactorKeepsTheEngineDivisor) {
  auto ds = ResolvePolicy("ds-4530").value();
  BucketContext c = Ctx(ReductionPath::kEngineAllreduce, 8, 2);
  c.predivide_factor = 2;
  BucketScaling s = PlanBucketScaling(ds, c);
  ASSERT_EQ(s.pre.size(), 1u);
  EXPECT_DOUBLE_EQ(s.pre[0].value, 0.5);
  EXPECT_DOUBLE_EQ(s.Divisor(), 4);
  c.prescale = true;
  EXPECT_DOUBLE_EQ(PlanBucketScaling(ds, c).Divisor(), 4);
}

TEST(Scaling, ZeroAllreducePathQuirkWhenFactorEqualsGroupSize) {
  // stage_1_and_2.py gradient_reduction_w_predivide compares the factor with
  // the full group size but divides by group/sp: factor == group skips the
  // post-multiply, leaving a divisor of `factor` instead of group/sp.
  auto ds = ResolvePolicy("ds-4530").value();
  BucketContext c = Ctx(ReductionPath::kZeroPartitioned, 4, 2);
  c.reduce_scatter = false;
  c.predivide_factor = 4;
  EXPECT_DOUBLE_EQ(PlanBucketScaling(ds, c).Divisor(), 4);
  c.predivide_factor = 1;
  EXPECT_DOUBLE_EQ(PlanBucketScaling(ds, c).Divisor(), 2);
}

TEST(Scaling, DeepSpeedVersionTable) {
  const auto E = ReductionPath::kEngineAllreduce, Z = ReductionPath::kZeroPartitioned;
  // Engine: / world until 0.14.0, / (world/sp) from 0.14.4.
  EXPECT_DOUBLE_EQ(PlanBucketScaling(ResolvePolicy("deepspeed@0.13.1").value(), Ctx(E, 4, 2)).Divisor(), 4);
  EXPECT_DOUBLE_EQ(PlanBucketScaling(ResolvePolicy("deepspeed@0.14.4").value(), Ctx(E, 4, 2)).Divisor(), 2);
  // ZeRO: double division on MoE buckets only in 0.12.6.
  EXPECT_DOUBLE_EQ(PlanBucketScaling(ResolvePolicy("deepspeed@0.12.6").value(), Ctx(Z, 4, 2, true)).Divisor(), 4);
  EXPECT_DOUBLE_EQ(PlanBucketScaling(ResolvePolicy("deepspeed@0.13.1").value(), Ctx(Z, 4, 2, true)).Divisor(), 2);
  // The versions real DeepSpeed was measured on (tools/repro/ds5248, docs/studies/ds5248.md), sp=2, dp=1:
  // a local-mean loss gives FINAL = (group / divisor) x reference, i.e. 2 / divisor here.
  struct Measured {
    const char* version;
    double engine_factor, zero_factor;  // stage 0, ZeRO-1/2
  };
  for (const Measured& m : {Measured{"0.11.1", 0, 1}, Measured{"0.11.2", 0, 2}, Measured{"0.13.0", 1, 2},
                            Measured{"0.13.1", 1, 2}, Measured{"0.14.5", 2, 2}, Measured{"0.19.8", 2, 2}}) {
    auto p = ResolvePolicy(std::string("deepspeed@") + m.version).value();
    if (m.engine_factor > 0) {  // 0.11.x stage 0 does not run on CPU: nothing measured
      EXPECT_DOUBLE_EQ(2 / PlanBucketScaling(p, Ctx(E, 2, 2)).Divisor(), m.engine_factor) << m.version;
    }
    EXPECT_DOUBLE_EQ(2 / PlanBucketScaling(p, Ctx(Z, 2, 2)).Divisor(), m.zero_factor) << m.version;
  }
  // MoE at dp=2 on 0.13.0: buckets holding expert parameters measured at 0.5 (divided twice), 1.0 on 0.13.1.
  EXPECT_DOUBLE_EQ(PlanBucketScaling(ResolvePolicy("deepspeed@0.13.0").value(), Ctx(Z, 2, 1, true)).Divisor(), 4);
  EXPECT_DOUBLE_EQ(PlanBucketScaling(ResolvePolicy("deepspeed@0.13.1").value(), Ctx(Z, 2, 1, true)).Divisor(), 2);
  // ZeRO-3 on 0.19.8, sp=2, dp=1, measured (docs/studies/ds5248.md): `loss` gives 1 on the reduce-scatter path
  // (coalesced_collectives.py:124 divides by world) and 2 on the all-reduce path (stage3.py:1878, world/sp).
  auto newest = ResolvePolicy("deepspeed@0.19.8").value();
  EXPECT_DOUBLE_EQ(2 / PlanBucketScaling(newest, Ctx(ReductionPath::kZero3ReduceScatter, 2, 2)).Divisor(), 1);
  EXPECT_DOUBLE_EQ(2 / PlanBucketScaling(newest, Ctx(ReductionPath::kZero3Allreduce, 2, 2)).Divisor(), 2);
  EXPECT_DOUBLE_EQ(PlanBucketScaling(newest, Ctx(ReductionPath::kZero3ReduceScatter, 4, 2)).Divisor(), 4);  // dp2 x sp2
  EXPECT_DOUBLE_EQ(PlanBucketScaling(newest, Ctx(ReductionPath::kZero3Allreduce, 4, 2)).Divisor(), 2);
  EXPECT_TRUE(newest.zero3_unmodelled.empty());
  EXPECT_FALSE(ResolvePolicy("deepspeed@0.14.5").value().zero3_unmodelled.empty());
  for (const auto& v : KnownDeepSpeedVersions()) {
    auto p = ResolvePolicy("deepspeed@" + v);
    ASSERT_TRUE(p.ok()) << v;
    EXPECT_NE(p->zero_cite.find("@ v" + v), std::string::npos) << p->zero_cite;
    EXPECT_NE(p->engine_cite.find("@ v" + v), std::string::npos) << p->engine_cite;
  }
}

}  // namespace
}  // namespace gradtrace::semantics
