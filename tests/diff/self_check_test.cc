#include "evidence/self_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "compare/diff_engine.h"
#include "expected_divisor.h"
#include "load/trace_set.h"
#include "test_dirs.h"

namespace gradtrace::diff {
namespace {
using testing::Config;
using testing::Synth;
using testing::SynthSpec;

Report Self(const std::string& dir) {
  auto r = RunSelfCheck(dir, {});
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(*r) : Report{};
}

TEST(SelfCheck, Ds4530DividesByDpOnly) {
  Report r = Self(Synth("b", Config(2, 2, 2, "ds-4530", "local-mean")));
  ASSERT_EQ(r.self_params.size(), 14u);
  for (const auto& p : r.self_params) {
    EXPECT_NEAR(p.divisor, 2.0, 1e-4) << p.name;
    EXPECT_EQ(p.group, "sdp");
    EXPECT_EQ(p.group_size, 4);
    EXPECT_EQ(p.expected, 4.0);
    EXPECT_EQ(p.verdict, SelfVerdict::kWrongDivisor);
  }
  EXPECT_EQ(r.verdict, "wrong-divisor");
  EXPECT_EQ(r.ExitCode(), 1);
  ASSERT_EQ(r.groups.size(), 1u);
  EXPECT_NE(r.groups[0].explanation.find("effective divisor 2.000 = dp for all 14 parameters"), std::string::npos)
      << r.groups[0].explanation;
  EXPECT_NE(r.groups[0].explanation.find("2.000 times the gradient"), std::string::npos) << r.groups[0].explanation;
}

TEST(SelfCheck, MeanDividesByGroupSize) {
  Report r = Self(Synth("b", Config(2, 2, 2, "mean", "local-mean")));
  ASSERT_EQ(r.self_params.size(), 14u);
  for (const auto& p : r.self_params) {
    EXPECT_NEAR(p.divisor, 4.0, 1e-4) << p.name;
    EXPECT_EQ(p.verdict, SelfVerdict::kOk);
  }
  EXPECT_EQ(r.verdict, "ok");
  EXPECT_EQ(r.ExitCode(), 0);
  EXPECT_NE(r.groups[0].explanation.find("= group size"), std::string::npos);
}

TEST(SelfCheck, Ds4530WithLossDividedBySpIsCorrect) {
  Report r = Self(Synth("b", Config(1, 4, 0, "ds-4530", "local-mean-div-sp")));
  for (const auto& p : r.self_params) {
    EXPECT_NEAR(p.divisor, 1.0, 1e-4) << p.name;  // dp = 1
    EXPECT_EQ(p.expected, 1.0);
    EXPECT_EQ(p.verdict, SelfVerdict::kOk);
  }
  EXPECT_EQ(r.ExitCode(), 0);
}

TEST(SelfCheck, SketchModeAlsoMeasuresTheDivisor) {
  auto spec = Config(2, 2, 2, "ds-4530", "local-mean");
  spec.capture = "sketch:64";
  Report r = Self(Synth("b", spec));
  ASSERT_EQ(r.self_params.size(), 14u);
  for (const auto& p : r.self_params) EXPECT_NEAR(p.divisor, 2.0, 1e-4) << p.name;
}

// Without PRE/POST (DTensor's reductions happen inside autograd) the replicas of FINAL are what is
// checked (issue 19); a caller that asks for no replica check still needs the reductions.
TEST(SelfCheck, WithoutPreAndPostChecksTheReplicasOfFinal) {
  auto spec = Config(2, 1, 0, "mean", "local-mean");
  spec.write_pre_post = false;
  const std::string dir = Synth("b", spec);
  auto r = RunSelfCheck(dir, {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ("ok", r->verdict);
  EXPECT_EQ("the replicas of every parameter agree in FINAL (no reductions recorded)", r->summary);
  SelfOptions no_replicas;
  no_replicas.replicas = false;
  auto e = RunSelfCheck(dir, no_replicas);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--self needs PRE_REDUCE and POST_REDUCE"), std::string::npos);
  // A replica that differs (rank 1's FINAL x 1.01): every parameter inconsistent, no divisor claimed.
  spec.disagree_rank = 1;
  auto bad = RunSelfCheck(Synth("bad", spec), {});
  ASSERT_TRUE(bad.ok()) << bad.status().message();
  EXPECT_EQ("inconsistent", bad->verdict);
  ASSERT_EQ(14u, bad->self_params.size());
  ASSERT_EQ(1u, bad->groups.size());
  EXPECT_EQ("inconsistent", bad->groups[0].kind);
  EXPECT_FALSE(bad->groups[0].scale.has_value());
}

bool HasFinding(const Report& r, const std::string& kind) {
  return std::any_of(r.findings.begin(), r.findings.end(), [&](const Finding& f) { return f.kind == kind; });
}

// --self reads FINAL once for its two checks of it, the replicas and the reported grad norm: each answers from
// that one pass, alone or together, and the norm is the one the two-set diff finds from its own comparison.
TEST(SelfCheck, ReplicasAndGradNormShareOneReadOfFinal) {
  auto spec = Config(2, 1, 0, "mean", "local-mean");
  spec.reported_grad_norm = 1e6;  // far from the synthetic gradients' norm
  const std::string dir = Synth("b", spec);
  auto diff = RunDiff(dir, dir, {});
  ASSERT_TRUE(diff.ok()) << diff.status().message();
  ASSERT_TRUE(diff->grad_norm.has_value());
  const double norm = diff->grad_norm->computed_a;
  ASSERT_GT(norm, 0);

  auto both = RunSelfCheck(dir, {});
  ASSERT_TRUE(both.ok()) << both.status().message();
  ASSERT_TRUE(both->grad_norm.has_value());
  EXPECT_NEAR(norm, both->grad_norm->computed_a, 1e-9 * norm);
  EXPECT_EQ("misreported", both->grad_norm->verdict);
  EXPECT_TRUE(HasFinding(*both, "grad-norm"));
  EXPECT_FALSE(HasFinding(*both, "replica"));

  SelfOptions norm_only;
  norm_only.replicas = false;
  auto alone = RunSelfCheck(dir, norm_only);
  ASSERT_TRUE(alone.ok()) << alone.status().message();
  ASSERT_TRUE(alone->grad_norm.has_value());
  EXPECT_NEAR(norm, alone->grad_norm->computed_a, 1e-9 * norm);

  SelfOptions neither = norm_only;
  neither.grad_norm = false;
  auto none = RunSelfCheck(dir, neither);
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_FALSE(none->grad_norm.has_value());

  // Replicas that disagree (rank 1's FINAL x 1.01) and the misreported norm, both found in the same pass.
  spec.disagree_rank = 1;
  auto bad = RunSelfCheck(Synth("bad", spec), {});
  ASSERT_TRUE(bad.ok()) << bad.status().message();
  EXPECT_EQ("inconsistent", bad->verdict);
  EXPECT_TRUE(HasFinding(*bad, "replica"));
  ASSERT_TRUE(bad->grad_norm.has_value());
  EXPECT_EQ("misreported", bad->grad_norm->verdict);
}

TEST(SelfCheck, ExpectedDivisorByLossRecipe) {
  pb::Config c;
  c.set_sp(4);
  c.set_dp(2);
  c.set_loss("local-mean");
  EXPECT_EQ(semantics::ExpectedDivisor(c, pb::DENSE, 8), 8);
  c.set_loss("token-weighted");
  EXPECT_EQ(semantics::ExpectedDivisor(c, pb::DENSE, 8), 2);
  // Tensor-parallel shards and replicated norms: reduced over dp like dense, never divided by tp.
  c.set_tp(2);
  EXPECT_EQ(semantics::ExpectedDivisor(c, pb::TP_SHARD, 8), 2);
  EXPECT_EQ(semantics::ExpectedDivisor(c, pb::REPLICATED, 8), 2);
  c.set_loss("");
  EXPECT_EQ(semantics::ExpectedDivisor(c, pb::DENSE, 8), 8);
}

// Experts need the dense divisor (dp), not their edp group's size (PRs #5259/#6546).
TEST(SelfCheck, ExpectedDivisorOfExperts) {
  pb::Config c;
  c.set_dp(4);
  c.set_ep_size(2);
  c.set_edp(2);
  c.set_loss("token-weighted");
  EXPECT_EQ(semantics::ExpectedDivisor(c, pb::EXPERT, 2), 4);
  c.set_sp(2);
  c.set_loss("local-mean");
  EXPECT_EQ(semantics::ExpectedDivisor(c, pb::EXPERT, 4), 8);
  // TP + MoE (Megatron-LM PR #7160): a group of dp x tp ranks holding tp copies of each expert.
  pb::Config t;
  t.set_dp(2);
  t.set_tp(2);
  t.set_loss("local-mean");
  EXPECT_EQ(semantics::ExpectedDivisor(t, pb::EXPERT, 2), 2);
  EXPECT_EQ(semantics::ExpectedDivisor(t, pb::EXPERT, 4), 4);
}

// Issue 19: the divisor depends on the group a reduction ran over. Megatron-style TP + sequence
// parallelism: a norm replicated on every tp rank holds each rank's tokens' partial sum, summed over
// tp (divisor 1), then averaged over dp (tests/python/test_megatron_self.py measures both).
TEST(SelfCheck, ExpectedDivisorDependsOnTheReductionsGroup) {
  pb::Config c;
  c.set_dp(4);
  c.set_tp(2);
  c.set_loss("local-mean");
  pb::ParamInfo norm;
  norm.set_kind(pb::REPLICATED);
  norm.set_grad_group("tp");
  EXPECT_TRUE(semantics::ModelParallelReduction(norm, "tp"));
  EXPECT_FALSE(semantics::ModelParallelReduction(norm, "dp"));
  EXPECT_EQ(semantics::ExpectedDivisorOver(c, norm, {"tp", 2, false}), 1);
  EXPECT_EQ(semantics::ExpectedDivisorOver(c, norm, {"dp", 4, false}), 4);
  EXPECT_EQ(semantics::ExpectedDivisorOver(c, norm, {"dp", 4, false}),
            semantics::ExpectedDivisor(c, pb::REPLICATED, 4));
  // Identical copies over tp (no sequence parallelism: every tp rank computed the whole gradient):
  // only their mean keeps it; summing them is tp x.
  EXPECT_EQ(semantics::ExpectedDivisorOver(c, norm, {"tp", 2, true}), 2);
  // A data-parallel reduction is judged as before, identical inputs or not.
  EXPECT_EQ(semantics::ExpectedDivisorOver(c, norm, {"dp", 4, true}), 4);
  // Any parameter reduced over "tp" (a norm left DENSE over dp by the adapter's default) ...
  pb::ParamInfo dense;
  dense.set_kind(pb::DENSE);
  dense.set_grad_group("dp");
  EXPECT_EQ(semantics::ExpectedDivisorOver(c, dense, {"tp", 2, false}), 1);
  EXPECT_EQ(semantics::ExpectedDivisorOver(c, dense, {"dp", 4, false}), 4);
  // ... and a REPLICATED parameter over its own model-parallel grad_group, whatever its name (a
  // DeviceMesh dim), but not over a data-parallel group it names.
  pb::ParamInfo mesh = norm;
  mesh.set_grad_group("model");
  EXPECT_EQ(semantics::ExpectedDivisorOver(c, mesh, {"model", 2, false}), 1);
  pb::ParamInfo over_dp = norm;
  over_dp.set_grad_group("dp");
  EXPECT_FALSE(semantics::ModelParallelReduction(over_dp, "dp"));
  EXPECT_EQ(semantics::ExpectedDivisorOver(c, over_dp, {"dp", 4, false}), 4);
  pb::ParamInfo shard_group = norm;
  shard_group.set_grad_group("shard");
  EXPECT_FALSE(semantics::ModelParallelReduction(shard_group, "shard"));
  // Unrecorded kinds (format 1.0/1.1) over a data-parallel group: the recipe's divisor, as before.
  EXPECT_EQ(semantics::ExpectedDivisorOver(c, pb::ParamInfo(), {"dp", 4, false}), 4);
}

SynthSpec ExpertSpec(bool correct) {
  SynthSpec s = Config(4, 1, 0, "mean", "token-weighted");
  s.experts = {"layers.1.mlp.fc1.weight", "layers.1.mlp.fc2.weight"};
  s.ep = 2;
  s.divide_as_expected = correct;
  s.run_id = correct ? "ep-correct" : "ep-edp";
  if (correct) s.recorded_scaling = "";  // a plain PyTorch EP run records no policy
  s.framework = "pytorch";
  return s;
}

// A correct expert-parallel run is ok; one dividing expert grads by edp is wrong-divisor on the experts only.
TEST(SelfCheck, ExpertParallelByRecordedKind) {
  Report ok = Self(Synth("a", ExpertSpec(true)));
  EXPECT_EQ(ok.verdict, "ok") << ok.summary;
  Report bad = Self(Synth("b", ExpertSpec(false)));
  EXPECT_EQ(bad.verdict, "wrong-divisor");
  int experts = 0;
  for (const auto& p : bad.self_params) {
    if (p.param_kind == "expert") {
      ++experts;
      EXPECT_EQ(p.verdict, SelfVerdict::kWrongDivisor) << p.name;
      EXPECT_NEAR(p.divisor, 2.0, 1e-4);
      EXPECT_EQ(p.expected, 4.0);
      EXPECT_EQ(p.group, "edp");
    } else {
      EXPECT_EQ(p.verdict, SelfVerdict::kOk) << p.name;
    }
  }
  EXPECT_EQ(experts, 2);
  // The headline is the expert group's finding, named by dimension and group, with no DeepSpeed history.
  ASSERT_FALSE(bad.groups.empty());
  EXPECT_EQ(bad.groups.front().param_kind, "expert");
  EXPECT_EQ(bad.groups.front().cause, semantics::Cause::kReductionDivisor);
  EXPECT_EQ(bad.groups.front().dimension, semantics::Dimension::kEp);
  EXPECT_EQ(bad.summary, bad.groups.front().explanation);
  EXPECT_NE(bad.summary.find("expert-data-parallel"), std::string::npos) << bad.summary;
  EXPECT_EQ(bad.summary.find('#'), std::string::npos) << bad.summary;
}

// The sampled pass (SelfOptions.sample) of `set`, each parameter it measured checked against the full pass: present
// there, with the same divisor. `full_params`: how many parameters the full pass measured.
std::vector<SelfParam> SampledMatchingFull(const TraceSet& set, size_t* full_params = nullptr) {
  SelfOptions full, sampled;
  sampled.sample = true;
  auto all = SelfCheckSet(set, full), few = SelfCheckSet(set, sampled);
  EXPECT_TRUE(all.ok() && few.ok());
  if (!all.ok() || !few.ok()) return {};
  for (const auto& p : few->self_params) {
    auto same = std::find_if(all->self_params.begin(), all->self_params.end(),
                             [&](const SelfParam& q) { return q.name == p.name; });
    EXPECT_NE(same, all->self_params.end()) << p.name;
    if (same != all->self_params.end()) {
      EXPECT_NEAR(p.divisor, same->divisor, 1e-9 * same->divisor) << p.name;
    }
  }
  if (full_params != nullptr) *full_params = all->self_params.size();
  return few->self_params;
}

// The diff's evidence pass (SelfOptions.sample) measures a few parameters per bucket, read from about one
// PRE frame per member: on buckets spanning several ~4 MB frames (each parameter 128x the default, all in
// one bucket) it measures fewer parameters than --self, every one with --self's divisor, and each kind.
TEST(SelfCheck, SampledPassMeasuresFewParametersWithTheFullDivisors) {
  SynthSpec spec = ExpertSpec(false);
  for (auto& p : spec.params) p.shape[0] *= 128;
  spec.bucket_elems = int64_t{1} << 24;
  spec.run_id = "sampled";
  auto set = TraceSet::Load(Synth("sampled", spec));
  ASSERT_TRUE(set.ok()) << set.status().message();
  size_t full_params = 0;
  const std::vector<SelfParam> few = SampledMatchingFull(*set, &full_params);
  ASSERT_EQ(full_params, 14u);
  EXPECT_LT(few.size(), full_params);
  std::set<std::string> kinds;
  for (const auto& p : few) {
    kinds.insert(p.param_kind);
    EXPECT_NEAR(p.divisor, p.param_kind == "expert" ? 2.0 : 4.0, 1e-4) << p.name;
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"dense", "expert"}));
}

// The sample holds a few thousand elements: the smallest whole parameters of the frame, past the third only
// while they stay within 16 Ki elements together, so a frame's one large weight among its biases is not summed
// (it was 99 % of the evidence's elements on the bench's 23M model); with only large parameters, three of them.
TEST(SelfCheck, SampledPassSumsTheSmallestParametersOfTheFrame) {
  auto sampled_names = [](const std::string& label, std::vector<testing::SynthParam> params) {
    SynthSpec spec = Config(2, 1, 0, "mean", "local-mean");
    spec.params = std::move(params);
    spec.bucket_elems = int64_t{1} << 22;
    spec.run_id = label;
    auto set = TraceSet::Load(Synth(label, spec));
    EXPECT_TRUE(set.ok()) << set.status().message();
    std::set<std::string> names;
    for (const auto& p : SampledMatchingFull(*set)) {
      names.insert(p.name);
      EXPECT_NEAR(p.divisor, 2.0, 1e-4) << p.name;
    }
    return names;
  };
  EXPECT_EQ(sampled_names("mixed", {{"a.bias", {768}},
                                    {"a.weight", {512, 512}},
                                    {"b.bias", {768}},
                                    {"c.bias", {768}},
                                    {"d.bias", {768}},
                                    {"tiny.bias", {16}}}),
            (std::set<std::string>{"a.bias", "b.bias", "c.bias", "d.bias"}));
  EXPECT_EQ(sampled_names(
                "large",
                {{"w0", {256, 256}}, {"w1", {256, 256}}, {"w2", {128, 256}}, {"w3", {256, 256}}, {"w4", {256, 256}}}),
            (std::set<std::string>{"w0", "w1", "w2"}));
}

// No DeepSpeed PR numbers for a plain PyTorch run's --self words.
TEST(SelfCheck, PlainPytorchCitesNoDeepSpeedHistory) {
  SynthSpec s = Config(2, 2, 0, "ds-4530", "local-mean");
  s.recorded_scaling = "";
  s.framework = "pytorch";
  Report r = Self(Synth("p", s));
  EXPECT_EQ(r.verdict, "wrong-divisor");
  EXPECT_NE(r.summary.find("divides by dp only"), std::string::npos) << r.summary;
  EXPECT_EQ(r.summary.find('#'), std::string::npos) << r.summary;
  // Under a DeepSpeed policy the same words cite #4530.
  Report ds = Self(Synth("d", Config(2, 2, 0, "ds-4530", "local-mean")));
  EXPECT_NE(ds.summary.find("#4530"), std::string::npos) << ds.summary;
}

}  // namespace
}  // namespace gradtrace::diff
