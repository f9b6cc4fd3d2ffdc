// Command line, rank layout and scaling arithmetic: everything of
// gradtrace-train that needs no collective.
#include <gtest/gtest.h>

#include <cstdlib>

#include "deepspeed_releases.h"
#include "launcher.h"
#include "scaling_policy.h"
#include "topology.h"
#include "train_options.h"

namespace gradtrace::capture {
namespace {

using namespace gradtrace::semantics;

Expected<TrainOptions> Parse(std::vector<const char*> args) {
  args.insert(args.begin(), "gradtrace-train");
  return ParseTrainOptions(static_cast<int>(args.size()), args.data());
}

TEST(TrainOptions, ParsesTheDesignCommandLine) {
  auto o = Parse({"--nproc", "4",         "--dp",      "2",        "--sp",       "2",       "--zero-stage",
                  "2",       "--scaling", "ds-4530",   "--loss",   "local-mean", "--steps", "2",
                  "--out",   "/tmp/x",    "--capture", "sketch:8", "--gas",      "2"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->nproc, 4);
  EXPECT_EQ(o->dp, 2);
  EXPECT_EQ(o->sp, 2);
  EXPECT_EQ(o->zero_stage, 2);
  EXPECT_EQ(o->scaling, "ds-4530");
  EXPECT_EQ(o->gas, 2);
  EXPECT_EQ(o->capture, "sketch:8");
}

TEST(TrainOptions, RejectsBadInputWithOneLine) {
  const std::vector<std::vector<const char*>> bad = {
      {"--out", "d", "--sp", "3"},                     // heads 4 not divisible by 3
      {"--out", "d", "--sp", "2", "--seq-len", "33"},  // seq-len not divisible
      {"--out", "d", "--dp", "3"},                     // batch 4 not divisible
      {"--out", "d", "--nproc", "3", "--dp", "2"},     // nproc != dp*sp
      {"--out", "d", "--scaling", "bogus"},
      {"--out", "d", "--scaling", "deepspeed@9.9.9"},
      {"--out", "d", "--scaling", "deepspeed@0.11.1", "--sp", "2", "--zero-stage", "0"},  // engine group not modelled
      {"--out", "d", "--loss", "mean"},
      {"--out", "d", "--zero-stage", "4"},
      {"--out", "d", "--zero-stage", "3", "--scaling", "deepspeed@0.13.1"},  // stage3.py not read there
      {"--out", "d", "--zero-stage", "3", "--gradient-predivide-factor", "2"},
      {"--out", "d", "--capture", "sketch:x"},
      {"--out", "d", "--capture", "Off"},
      {"--out", "d", "--zstd-level", "0"},
      {"--out", "d", "--capture-queue-mb", "0"},
      {"--out", "d", "--writer-threads", "0"},
      {"--out", "d", "--capture-steps", "1,a"},
      {"--out", "d", "--capture-params", "("},
      {"--out", "d", "--no-such-flag"},
      {"--steps", "1"},  // no --out
  };
  for (const auto& args : bad) {
    auto o = Parse(args);
    std::string joined;
    for (auto* a : args) joined += std::string(a) + " ";
    ASSERT_FALSE(o.ok()) << joined;
    EXPECT_FALSE(o.status().message().empty()) << joined;
    EXPECT_EQ(o.status().message().find('\n'), std::string::npos) << joined;
  }
}

TEST(TrainOptions, ExportInitAloneNeedsNoOut) {
  auto o = Parse({"--export-init", "/tmp/init.pt", "--sp", "2"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->export_init, "/tmp/init.pt");
  EXPECT_TRUE(o->out.empty());
  EXPECT_FALSE(Parse({"--export-init", "/tmp/init.pt", "--sp", "3"}).ok());  // still validated
}

TEST(TrainOptions, CaptureOffNeedsNoOutAndCaptureKnobsParse) {
  auto off = Parse({"--capture", "off"});
  ASSERT_TRUE(off.ok()) << off.status().message();
  EXPECT_TRUE(CaptureOff(*off));
  auto o = Parse({"--out", "d", "--zstd-level", "3", "--capture-queue-mb", "1024", "--writer-threads", "2"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_FALSE(CaptureOff(*o));
  EXPECT_EQ(o->zstd_level, 3);
  EXPECT_EQ(o->capture_queue_mb, 1024);
  EXPECT_EQ(o->writer_threads, 2);
  EXPECT_EQ(Parse({"--out", "d"})->zstd_level, 1);  // the measured default (docs/performance.md)
  auto bad = Parse({"--out", "d", "--capture", "bogus"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("or off to train without capture"), std::string::npos)
      << bad.status().message();
}

#ifndef USE_C10D_NCCL
TEST(TrainOptions, NcclInACpuBuildIsAClearError) {
  auto o = Parse({"--out", "d", "--backend", "nccl"});
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("GRADTRACE_CUDA"), std::string::npos) << o.status().message();
}
#endif

TEST(TrainOptions, LauncherDropsNproc) {
  const char* argv[] = {"t", "--nproc", "4", "--dp", "2", "--nproc=4", "--sp", "2"};
  auto args = ArgsWithoutNproc(8, argv);
  EXPECT_EQ(args, (std::vector<std::string>{"t", "--dp", "2", "--sp", "2"}));
}

TEST(TrainOptions, StepLists) {
  EXPECT_EQ(ParseStepList("0,2,4-6").value(), (std::vector<int64_t>{0, 2, 4, 5, 6}));
  EXPECT_FALSE(ParseStepList("5-3").ok());
}

TEST(Topology, SpConsecutiveDpStrided) {
  Topology t{2, 3, 4};  // dp 2, sp 3, rank 4
  EXPECT_EQ(t.world(), 6);
  EXPECT_EQ(t.dp_rank(), 1);
  EXPECT_EQ(t.sp_rank(), 1);
  EXPECT_EQ(t.SpGroup(1), (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(t.DpGroup(1), (std::vector<int>{1, 4}));
}

TEST(Launcher, SlurmFirstHost) {
  EXPECT_EQ(FirstSlurmHost("node[03-05,7],gpu1"), "node03");
  EXPECT_EQ(FirstSlurmHost("gpu1,gpu2"), "gpu1");
  EXPECT_EQ(FirstSlurmHost("a[1,2]"), "a1");
}

TEST(Launcher, SlurmEnvironment) {
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  setenv("SLURM_PROCID", "3", 1);
  setenv("SLURM_NTASKS", "4", 1);
  setenv("SLURM_LOCALID", "1", 1);
  setenv("SLURM_JOB_NODELIST", "n[10-11]", 1);
  setenv("SLURM_JOB_ID", "12345", 1);
  unsetenv("MASTER_ADDR");
  unsetenv("MASTER_PORT");
  auto e = DistEnvFromEnvironment();
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_EQ(e->source, "slurm");
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->world, 4);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->master_addr, "n10");
  EXPECT_EQ(e->master_port, 29500 + 345);
  setenv("SLURM_NTASKS", "x", 1);
  EXPECT_FALSE(DistEnvFromEnvironment().ok());
  for (auto* v : {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_NODELIST", "SLURM_JOB_ID"}) unsetenv(v);
}

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
  // The versions real DeepSpeed was measured on (tools/repro/ds5248, docs/ds5248.md), sp=2, dp=1:
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
  // ZeRO-3 on 0.19.8, sp=2, dp=1, measured (docs/ds5248.md): `loss` gives 1 on the reduce-scatter path
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
}  // namespace gradtrace::capture
