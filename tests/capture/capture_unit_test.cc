// Command line, rank layout and launcher helpers: everything of
// gradtrace-train that needs no collective. (The scaling arithmetic is
// semantics/'s, tested without LibTorch in tests/semantics.)
#include <gtest/gtest.h>

#include <cstdlib>

#include "launcher.h"
#include "topology.h"
#include "train_options.h"
#include "trainer.h"

namespace gradtrace::capture {
namespace {

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

// Issue 21: --dtype takes proto/dtype.h's names and aliases, --loss the recipes and semantics/loss_recipes.h's
// aliases; both are held by the canonical name. An unknown dtype used to be trained as fp32 without a word.
TEST(TrainOptions, DtypeAndLossSpellingsAreHeldByTheirCanonicalName) {
  auto o = Parse({"--out", "d", "--dtype", "half", "--loss", "loss-div-sp"});
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->dtype, "FP16");
  EXPECT_EQ(o->loss, "local-mean-div-sp");
  auto f64 = Parse({"--out", "d", "--dtype", "fp64", "--loss", "loss"});
  ASSERT_TRUE(f64.ok()) << f64.status().message();
  EXPECT_EQ(f64->dtype, "FP64");
  EXPECT_EQ(f64->loss, "local-mean");
  EXPECT_FALSE(Parse({"--out", "d", "--dtype", "fp8"}).ok());
  EXPECT_FALSE(Parse({"--out", "d", "--loss", "alst"}).ok());  // an alias of a recipe gradtrace-train does not run
  TrainOptions bad;
  bad.out = "d";
  bad.dtype = "fp8";
  EXPECT_EQ(ValidateTrainOptions(bad).message(),
            "--dtype fp8: expected FP32, FP16, BF16 or FP64 (or an alias such as fp32, bfloat16)");
  EXPECT_EQ(at::kBFloat16, TorchDType("bf16"));
  EXPECT_EQ(at::kFloat, TorchDType(TrainOptions{}.dtype));
  EXPECT_THROW(TorchDType("fp8"), c10::Error);
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
  EXPECT_EQ(Parse({"--out", "d"})->zstd_level, 1);  // the measured default (docs/dev/performance.md)
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

}  // namespace
}  // namespace gradtrace::capture
