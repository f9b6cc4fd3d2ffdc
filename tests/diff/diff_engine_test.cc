#include "compare/diff_engine.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "test_dirs.h"

namespace gradtrace::diff {
namespace {
namespace fs = std::filesystem;
using testing::Config;
using testing::Reference;
using testing::Synth;

Report Diff(const std::string& a, const std::string& b, DiffOptions o = {}) {
  auto r = RunDiff(a, b, o);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(*r) : Report{};
}

int CountVerdict(const Report& r, Verdict v) {
  int n = 0;
  for (const auto& p : r.params) n += p.verdict == v;
  return n;
}

// DeepSpeed #5248: ds-4530 + local-mean at sp=2 is sp times the reference.
TEST(DiffEngine, Issue5248Sp2IsScaledBySp) {
  std::string a = Synth("ref", Reference());
  std::string b = Synth("sp2", Config(1, 2, 2, "ds-4530", "local-mean"));
  Report r = Diff(a, b);
  EXPECT_EQ(r.verdict, "scaled");
  EXPECT_EQ(r.ExitCode(), 1);
  ASSERT_EQ(r.groups.size(), 1u);
  EXPECT_NEAR(*r.groups[0].scale, 2.0, 1e-5);
  EXPECT_EQ(r.groups[0].count, 14);
  EXPECT_EQ(r.groups[0].expression, "sp(B)");
  EXPECT_EQ(r.groups[0].explanation,
            "B/A = 2.000 = sp(B) for all 14 parameters: the per-rank loss is a local mean and the reduction divides by "
            "dp only (DeepSpeed ZeRO-1/2 since #4530); use backward(loss / sp) (local-mean-div-sp) or a loss weighted "
            "by the whole sequence's valid tokens");
  EXPECT_EQ(r.groups[0].cause, semantics::Cause::kLossMultiplier);
  EXPECT_EQ(r.groups[0].dimension, semantics::Dimension::kSp);
  EXPECT_EQ(CountVerdict(r, Verdict::kScaled), 14);
  for (const auto& p : r.params) {
    EXPECT_EQ(p.metrics.basis, Basis::kFull) << p.name;
    EXPECT_LT(p.metrics.residual, 1e-5) << p.name;
  }
}

TEST(DiffEngine, Issue5248Sp4Dp2IsScaledBy4) {
  std::string a = Synth("ref", Reference());
  std::string b = Synth("sp4", Config(2, 4, 2, "ds-4530", "local-mean"));
  Report r = Diff(a, b);
  EXPECT_EQ(r.ExitCode(), 1);
  ASSERT_EQ(r.groups.size(), 1u);
  EXPECT_NEAR(*r.groups[0].scale, 4.0, 1e-5);
  EXPECT_EQ(r.groups[0].expression, "sp(B)");
  EXPECT_NE(r.groups[0].explanation.find("B/A = 4.000 = sp(B) for all 14 parameters"), std::string::npos);
}

TEST(DiffEngine, LossDividedBySpMatches) {
  std::string a = Synth("ref", Reference());
  std::string b = Synth("divsp", Config(2, 2, 2, "ds-4530", "local-mean-div-sp"));
  Report r = Diff(a, b);
  EXPECT_EQ(r.verdict, "match") << r.summary;
  EXPECT_EQ(r.ExitCode(), 0);
  EXPECT_EQ(CountVerdict(r, Verdict::kMatch), 14);
}

TEST(DiffEngine, MeanPolicyMatches) {
  std::string a = Synth("ref", Reference());
  std::string b = Synth("mean", Config(2, 2, 0, "mean", "local-mean"));
  Report r = Diff(a, b);
  EXPECT_EQ(r.verdict, "match");
  ASSERT_EQ(r.groups.size(), 1u);
  EXPECT_EQ(r.groups[0].expression, "1");
}

TEST(DiffEngine, ScrambledParametersAreMismatches) {
  std::string a = Synth("ref", Reference());
  auto spec = Config(2, 1, 0, "mean", "local-mean");
  spec.scramble = {"layers.0.mlp.fc1.weight", "head.weight"};
  Report r = Diff(a, Synth("b", spec));
  EXPECT_EQ(r.verdict, "mismatch");
  EXPECT_EQ(CountVerdict(r, Verdict::kMismatch), 2);
  EXPECT_EQ(CountVerdict(r, Verdict::kMatch), 12);
  // Worst first.
  EXPECT_EQ(r.params[0].verdict, Verdict::kMismatch);
  EXPECT_EQ(r.params[1].verdict, Verdict::kMismatch);
  bool found = false;
  for (const auto& g : r.groups) found |= g.kind == "mismatch" && g.count == 2;
  EXPECT_TRUE(found);
}

TEST(DiffEngine, PartlyScaledGivesTwoGroups) {
  std::string a = Synth("ref", Reference());
  auto spec = Config(1, 2, 0, "mean", "local-mean");
  spec.extra_factor = {{"layers.1.attn.qkv.weight", 0.5}, {"layers.1.attn.qkv.bias", 0.5}};
  Report r = Diff(a, Synth("b", spec));
  ASSERT_EQ(r.groups.size(), 2u);
  // The finding first (GroupParams: most serious, then largest), and it is the headline.
  EXPECT_EQ(r.groups[0].count, 2);
  EXPECT_NEAR(*r.groups[0].scale, 0.5, 1e-5);
  EXPECT_EQ(r.groups[0].expression, "1/sp(B)");
  EXPECT_EQ(r.summary, r.groups[0].explanation);
  EXPECT_EQ(r.groups[1].count, 12);
  EXPECT_NEAR(*r.groups[1].scale, 1.0, 1e-5);
}

TEST(DiffEngine, SketchAgreesWithFullOnScale) {
  std::string a = Synth("ref", Reference());
  auto full = Diff(a, Synth("full", Config(1, 2, 2, "ds-4530", "local-mean")));
  auto spec = Config(1, 2, 2, "ds-4530", "local-mean");
  spec.capture = "sketch:64";
  auto sketch = Diff(a, Synth("sketch", spec));
  ASSERT_EQ(sketch.params.size(), full.params.size());
  ASSERT_EQ(sketch.groups.size(), 1u);
  EXPECT_NEAR(*sketch.groups[0].scale, *full.groups[0].scale, 1e-5);
  for (const auto& p : sketch.params) {
    EXPECT_EQ(p.metrics.basis, Basis::kSketch) << p.name;
    EXPECT_NEAR(p.metrics.scale, 2.0, 1e-5) << p.name;
    EXPECT_EQ(p.verdict, Verdict::kScaled) << p.name;
  }
  // And the other way round: sketched reference, full B.
  auto ref_spec = Reference();
  ref_spec.capture = "sketch:32";
  auto swapped = Diff(Synth("refsketch", ref_spec), Synth("full2", Config(1, 2, 0, "ds-4530", "local-mean")));
  ASSERT_EQ(swapped.groups.size(), 1u);
  EXPECT_NEAR(*swapped.groups[0].scale, 2.0, 1e-5);
}

TEST(DiffEngine, StatsModeComparesMoments) {
  std::string a = Synth("ref", Reference());
  auto spec = Config(1, 4, 0, "ds-4530", "local-mean");
  spec.capture = "stats";
  auto r = Diff(a, Synth("stats", spec));
  ASSERT_FALSE(r.params.empty());
  for (const auto& p : r.params) {
    EXPECT_EQ(p.metrics.basis, Basis::kStats) << p.name;
    EXPECT_NEAR(p.metrics.scale, 4.0, 1e-4) << p.name;
    EXPECT_NE(p.note.find("stats mode"), std::string::npos);
  }
}

TEST(DiffEngine, RenameRules) {
  std::string a = Synth("ref", Reference());
  auto spec = Config(1, 2, 2, "ds-4530", "local-mean");
  spec.name_prefix = "module.";
  std::string b = Synth("prefixed", spec);
  auto refused = RunDiff(a, b, {});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--rename"), std::string::npos) << refused.status().message();
  DiffOptions o;
  o.renames = {"^module\\.="};
  Report r = Diff(a, b, o);
  EXPECT_EQ(CountVerdict(r, Verdict::kScaled), 14);
  EXPECT_EQ(r.params[0].name.rfind("module.", 0), std::string::npos);
  o.renames = {"no-equals-sign"};
  auto bad = RunDiff(a, b, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("REGEX=REPLACEMENT"), std::string::npos);
}

TEST(DiffEngine, PostPhaseReassemblesZeroPartitions) {
  std::string a = Synth("ref", Reference());
  DiffOptions o;
  o.phase = pb::POST_REDUCE;
  Report r = Diff(a, Synth("zero2", Config(2, 2, 2, "ds-4530", "local-mean")), o);
  EXPECT_EQ(r.phase, "post");
  ASSERT_EQ(r.groups.size(), 1u);
  EXPECT_NEAR(*r.groups[0].scale, 2.0, 1e-5);
  for (const auto& p : r.params) EXPECT_EQ(p.metrics.basis, Basis::kFull) << p.name << ": " << p.note;
}

TEST(DiffEngine, PrePhaseSumsRanks) {
  // Local-mean shares sum to world x g before the reduction divides.
  std::string a = Synth("ref", Reference());
  DiffOptions o;
  o.phase = pb::PRE_REDUCE;
  Report r = Diff(a, Synth("b", Config(2, 2, 2, "mean", "local-mean")), o);
  ASSERT_EQ(r.groups.size(), 1u);
  EXPECT_NEAR(*r.groups[0].scale, 4.0, 1e-5);
}

TEST(DiffEngine, ReplicaDisagreementIsAFinding) {
  std::string a = Synth("ref", Reference());
  auto spec = Config(2, 1, 0, "mean", "local-mean");
  spec.disagree_rank = 1;
  Report r = Diff(a, Synth("b", spec));
  EXPECT_EQ(r.verdict, "mismatch");
  int replica = 0;
  for (const auto& f : r.findings) replica += f.kind == "replica";
  EXPECT_EQ(replica, 14);
  EXPECT_NE(r.findings.back().message.find("rank 0 vs rank 1"), std::string::npos) << r.findings.back().message;
}

TEST(DiffEngine, TruncatedInputIsCountedInTheVerdict) {
  std::string a = Synth("ref", Reference());
  std::string b = Synth("b", Config(2, 1, 2, "mean", "local-mean"));
  std::string victim = b + "/rank-00001.gtrace";
  ASSERT_TRUE(testing::TruncateFile(victim, fs::file_size(victim) - 300).ok());
  Report r = Diff(a, b);
  EXPECT_EQ(r.ExitCode(), 1);
  EXPECT_TRUE(r.verdict == "missing" || r.verdict == "incomplete") << r.verdict;
  bool truncated = false;
  for (const auto& f : r.findings) truncated |= f.kind == "truncated" && f.message.find(victim) != std::string::npos;
  EXPECT_TRUE(truncated);
}

TEST(DiffEngine, NoiseFromSecondReference) {
  auto ref = Config(2, 1, 0, "mean", "local-mean");
  std::string a = Synth("ref", ref);
  ref.split_seed = 99;  // same math, different rounding
  ref.run_id = "ref2";
  std::string a2 = Synth("ref2", ref);
  DiffOptions o;
  o.noise_dir = a2;
  Report r = Diff(a, Synth("b", Config(1, 2, 0, "ds-4530", "local-mean")), o);
  EXPECT_EQ(r.tolerance.source, "noise");
  EXPECT_GT(r.tolerance.rtol, 0);
  EXPECT_LT(r.tolerance.rtol, 1e-4);
  EXPECT_EQ(CountVerdict(r, Verdict::kScaled), 14);
}

TEST(DiffEngine, RtolOverrides) {
  std::string a = Synth("ref", Reference());
  DiffOptions o;
  o.rtol = 2.0;  // anything goes
  Report r = Diff(a, Synth("b", Config(1, 2, 0, "ds-4530", "local-mean")), o);
  EXPECT_EQ(r.tolerance.source, "rtol");
  EXPECT_EQ(r.verdict, "match");
}

TEST(DiffEngine, ThreadsAndUnitSizeDoNotChangeResults) {
  std::string a = Synth("ref", Reference());
  std::string b = Synth("b", Config(2, 2, 2, "ds-4530", "local-mean"));
  DiffOptions one;
  one.threads = 1;
  DiffOptions many;
  many.threads = 4;
  many.unit_elements = 100;  // one parameter per unit
  Report x = Diff(a, b, one), y = Diff(a, b, many);
  ASSERT_EQ(x.params.size(), y.params.size());
  for (size_t i = 0; i < x.params.size(); ++i) {
    EXPECT_EQ(x.params[i].name, y.params[i].name);
    EXPECT_DOUBLE_EQ(x.params[i].metrics.scale, y.params[i].metrics.scale);
  }
  // Each side's evidence: measured inline on one thread, among the comparison's units on several.
  for (auto [ex, ey] : {std::pair{&x.a.reductions, &y.a.reductions}, std::pair{&x.b.reductions, &y.b.reductions}}) {
    ASSERT_EQ(ex->size(), ey->size());
    for (size_t i = 0; i < ex->size(); ++i) {
      EXPECT_EQ((*ex)[i].param_kind, (*ey)[i].param_kind);
      EXPECT_EQ((*ex)[i].group_size, (*ey)[i].group_size);
      EXPECT_DOUBLE_EQ((*ex)[i].measured, (*ey)[i].measured);
    }
  }
  ASSERT_EQ(y.b.reductions.size(), 1u);
  EXPECT_EQ(y.b.reductions[0].group_size, 4);          // dp 2 x sp 2
  EXPECT_NEAR(y.b.reductions[0].measured, 2.0, 1e-4);  // ds-4530 divides by dp only
  EXPECT_EQ(x.verdict, y.verdict);
  EXPECT_EQ(x.summary, y.summary);
}

// A's and B's catalogues load at once on several threads; the error named is still A's when both fail, B's when
// only B does, on any thread count.
TEST(DiffEngine, LoadErrorsNameASetFirst) {
  const std::string good = Synth("ref", Reference());
  const std::string missing_a = good + "-no-a", missing_b = good + "-no-b";
  for (int threads : {1, 2, 4}) {
    DiffOptions o;
    o.threads = threads;
    auto both = RunDiff(missing_a, missing_b, o);
    ASSERT_FALSE(both.ok());
    EXPECT_EQ(both.status().message(), missing_a + ": no such directory") << threads;
    auto only_b = RunDiff(good, missing_b, o);
    ASSERT_FALSE(only_b.ok());
    EXPECT_EQ(only_b.status().message(), missing_b + ": no such directory") << threads;
  }
}

TEST(DiffEngine, StepSelection) {
  auto spec = Reference();
  spec.steps = 3;
  std::string a = Synth("ref", spec);
  auto bspec = Config(1, 2, 0, "ds-4530", "local-mean");
  bspec.steps = 3;
  std::string b = Synth("b", bspec);
  Report first = Diff(a, b);
  EXPECT_EQ(first.step, 0);
  DiffOptions o;
  o.step = 2;
  Report last = Diff(a, b, o);
  EXPECT_EQ(last.step, 2);
  EXPECT_NEAR(*last.groups[0].scale, 2.0, 1e-5);
  o.step = 7;
  auto none = RunDiff(a, b, o);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().message(), a + ": no final records for step 7");
}

TEST(DiffEngine, GradientAccumulationMicroStepsAreSummed) {
  auto ref = Reference();
  std::string a = Synth("ref", ref);
  auto spec = Config(1, 2, 2, "ds-4530", "local-mean");
  spec.gas = 2;
  Report r = Diff(a, Synth("gas", spec));
  ASSERT_EQ(r.groups.size(), 1u);
  EXPECT_NEAR(*r.groups[0].scale, 2.0, 1e-5);
  DiffOptions o;
  o.phase = pb::POST_REDUCE;
  Report post = Diff(a, Synth("gas2", spec), o);
  EXPECT_NEAR(*post.groups[0].scale, 2.0, 1e-5);
}

}  // namespace
}  // namespace gradtrace::diff
