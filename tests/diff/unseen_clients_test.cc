// Issue 19: answers on clients no earlier test contained -- a bug that starts
// after step 0, gradients zero up to rounding, gas left unrecorded, another
// init seed or data order, compressed communication, negative scales.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "compare/diff_engine.h"
#include "compare/step_table.h"
#include "report/report.h"
#include "test_dirs.h"

namespace gradtrace::diff {
namespace {
using testing::Reference;
using testing::Synth;
using testing::SynthSpec;

SynthSpec WithSteps(SynthSpec s, int steps) {
  s.steps = steps;
  return s;
}

// Every parameter of the default model times `factor` (from step `from` on).
SynthSpec AllTimes(SynthSpec s, double factor, int64_t from = 0) {
  for (const auto& p : s.params) s.extra_factor[p.name] = factor;
  s.factor_from_step = from;
  return s;
}

Expected<Report> DiffAt(const std::string& a, const std::string& b, std::optional<int64_t> step = std::nullopt) {
  DiffOptions o;
  o.step = step;
  return RunDiffSteps(a, b, o);
}

// PowerSGD-like: correct at step 0, wrong from step 1. The default used to compare step 0 only (exit 0).
TEST(UnseenClients, DefaultComparesEveryStepAndReportsTheFirstThatDiffers) {
  const std::string a = Synth("ref", WithSteps(Reference(), 3));
  const std::string b = Synth("late", AllTimes(WithSteps(Reference(), 3), 2.0, 1));
  auto r = DiffAt(a, b);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(1, r->step);
  EXPECT_EQ("scaled", r->verdict);
  EXPECT_EQ(1, r->ExitCode());
  ASSERT_EQ(3u, r->steps.size());
  EXPECT_EQ("match", r->steps[0].verdict);
  EXPECT_EQ(14, r->steps[0].match);
  EXPECT_EQ("scaled", r->steps[1].verdict);
  EXPECT_EQ(14, r->steps[1].differ);
  ASSERT_FALSE(r->groups.empty());
  EXPECT_NEAR(2.0, *r->groups[0].scale, 1e-6);
  const auto j = nlohmann::json::parse(RenderJson(*r));
  EXPECT_EQ(kReportSchemaVersion, j["schema_version"]);
  ASSERT_EQ(3u, j["steps"].size());
  EXPECT_EQ(2, j["steps"][2]["step"]);
  EXPECT_EQ("scaled", j["steps"][2]["verdict"]);
  const std::string text = RenderText(*r, false);
  EXPECT_NE(std::string::npos, text.find("Step 1, the first that differs")) << text;
  // --step 0 still compares that step alone, and it matches.
  auto s0 = DiffAt(a, b, 0);
  ASSERT_TRUE(s0.ok());
  EXPECT_EQ("match", s0->verdict);
  EXPECT_TRUE(s0->steps.empty());
}

TEST(UnseenClients, AllStepsMatchingReportsTheFirstStep) {
  const std::string a = Synth("ref", WithSteps(Reference(), 2));
  SynthSpec b = WithSteps(Reference(), 2);
  b.split_seed = 11;  // another rounding, same gradients
  auto r = DiffAt(a, Synth("b", b));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(0, r->step);
  EXPECT_EQ("match", r->verdict);
  EXPECT_EQ(0, r->ExitCode());
  EXPECT_EQ(2u, r->steps.size());
}

// Gradients far below the step's other gradients match by the absolute floor; their B/A is noise over
// noise and made a scale group of its own ("0.858, unexplained") in an exit-0 report.
TEST(UnseenClients, ParametersZeroUpToRoundingAreANoteNotAScaleGroup) {
  SynthSpec a = Reference(), b = Reference();
  a.extra_factor["layers.0.attn.qkv.bias"] = 1e-12;
  b.extra_factor["layers.0.attn.qkv.bias"] = 0.858e-12;
  auto r = DiffAt(Synth("a", a), Synth("b", b));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ("match", r->verdict);
  ASSERT_EQ(1u, r->groups.size());
  EXPECT_NEAR(1.0, *r->groups[0].scale, 1e-6);
  EXPECT_EQ(13, r->groups[0].count);
  bool noted = false;
  for (const Finding& f : r->findings) {
    noted |= f.kind == "note" && f.message.find("1 parameter is zero up to rounding") == 0 &&
             f.message.find("layers.0.attn.qkv.bias") != std::string::npos;
  }
  EXPECT_TRUE(noted);
}

// gas 4 run by a producer that did not record it: 4.000 is explained by gas, and the inference said.
TEST(UnseenClients, GasIsInferredFromTheRecordedMicroSteps) {
  SynthSpec b = Reference();
  b.gas = 4;
  b.recorded_gas = 1;
  b.loss_multiplier = 4;  // a sum over micro-steps of per-micro-step means, not divided by gas
  auto r = DiffAt(Synth("a", Reference()), Synth("b", b));
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_FALSE(r->groups.empty());
  EXPECT_NEAR(4.0, *r->groups[0].scale, 1e-6);
  EXPECT_EQ(r->groups[0].dimension, semantics::Dimension::kGas) << r->groups[0].explanation;
  EXPECT_EQ(4, r->b.config.gas());
  bool said = false;
  for (const Finding& f : r->findings) said |= f.message.find("B: gas 4 inferred from the 4 micro-steps") == 0;
  EXPECT_TRUE(said);
}

TEST(UnseenClients, AnotherInitSeedIsADifferentStartNotAMismatch) {
  SynthSpec a = Reference(), b = Reference();
  a.init_seed = 1;
  b.init_seed = 2;
  b.scramble = {"embed.weight", "layers.0.attn.qkv.weight"};  // what another start does to the gradients
  auto r = DiffAt(Synth("a", a), Synth("b", b));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ("different-start", r->verdict);
  EXPECT_EQ(3, r->ExitCode());
  EXPECT_EQ(0u, r->summary.find("A and B start from different weights (14 of 14 parameters")) << r->summary;
  // The same gradients from the same start: a mismatch, as before.
  b.init_seed = 1;
  auto same = DiffAt(Synth("a2", a), Synth("b2", b));
  ASSERT_TRUE(same.ok());
  EXPECT_EQ("mismatch", same->verdict);
  EXPECT_EQ(1, same->ExitCode());
}

TEST(UnseenClients, DifferentDataFromAStepIsNamedWithTheStep) {
  SynthSpec a = WithSteps(Reference(), 3), b = WithSteps(Reference(), 3);
  a.data_seed = b.data_seed = 1;
  b.data_seed = 5;
  b.data_seed_from_step = 1;
  b = AllTimes(b, 1.5, 1);  // what other data does to the gradients from then on
  b.dp = 2;                 // split differently: the moments still agree where the data do
  auto r = DiffAt(Synth("a", a), Synth("b", b));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(1, r->step);
  EXPECT_EQ("different-data", r->verdict);
  EXPECT_EQ(3, r->ExitCode());
  EXPECT_EQ(0u, r->summary.find("A and B saw different data from step 1")) << r->summary;
}

// torch's bf16_compress_hook: fp32 buckets all-reduced in bf16. Recorded, it is a match within bf16
// rounding; unrecorded (a 1.3 producer), the fp32 bound flags it; a real 2x under bf16 stays scaled.
TEST(UnseenClients, CompressedCommunicationIsJudgedWithItsPrecision) {
  const std::string a = Synth("ref", Reference());
  SynthSpec b = testing::Config(2, 1, 0, "mean", "local-mean");
  b.comm_dtype = "bf16";
  b.comm_hook = "bf16_compress_hook";
  auto r = DiffAt(a, Synth("bf16", b));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ("match", r->verdict) << r->summary;
  // Dtypes in words by their one canonical name (proto/dtype.h, issue 21).
  EXPECT_EQ("all 14 parameters match within BF16 rounding (B communicates in BF16 (bf16_compress_hook))", r->summary);
  EXPECT_EQ("BF16", r->tolerance.precision);
  b.record_comm_dtype = false;
  auto unrecorded = DiffAt(a, Synth("bf16-unrecorded", b));
  ASSERT_TRUE(unrecorded.ok());
  EXPECT_EQ("mismatch", unrecorded->verdict);
  b.record_comm_dtype = true;
  auto twice = DiffAt(a, Synth("bf16-2x", AllTimes(b, 2.0)));
  ASSERT_TRUE(twice.ok());
  EXPECT_EQ("scaled", twice->verdict);
  ASSERT_FALSE(twice->groups.empty());
  EXPECT_NEAR(2.0, *twice->groups[0].scale, 0.01);
}

// Gradients accumulated in bf16 (ParamInfo.accum_dtype) of fp32 parameters: judged with bf16's rounding,
// and the inference said.
TEST(UnseenClients, AccumulationDtypeSetsThePrecision) {
  SynthSpec b = testing::Config(2, 1, 0, "mean", "local-mean");
  b.comm_dtype = "bf16";  // the values carry bf16 rounding...
  b.record_comm_dtype = false;
  b.accum_dtype = "bf16";  // ...which the trace attributes to accumulation
  auto r = DiffAt(Synth("ref", Reference()), Synth("accum", b));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ("match", r->verdict) << r->summary;
  EXPECT_EQ("all 14 parameters match within BF16 rounding (B trains in BF16)", r->summary);
  bool said = false;
  for (const Finding& f : r->findings) {
    said |= f.message ==
            "B: gradients accumulated in BF16 (ParamInfo.accum_dtype) while Config.dtype is FP32: judged "
            "with BF16's rounding";
  }
  EXPECT_TRUE(said);
}

TEST(UnseenClients, PowerSgdMismatchIsNamedAsLossyCompression) {
  SynthSpec b = testing::Config(2, 1, 0, "mean", "local-mean");
  b.comm_hook = "powerSGD_hook";
  b.scramble = {"layers.0.mlp.fc1.weight"};
  auto r = DiffAt(Synth("ref", Reference()), Synth("psgd", b));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ("mismatch", r->verdict);
  ASSERT_FALSE(r->groups.empty());
  EXPECT_EQ(r->groups[0].cause, semantics::Cause::kLossyCompression);
  EXPECT_EQ("B", r->groups[0].side);
}

// Also the regression test of --self's divisor clustering, which looped forever on a negative divisor
// (the diff's evidence pass runs it on B).
TEST(UnseenClients, NegativeScalesKeepTheTextColumnsApart) {
  SynthSpec b = Reference();
  b.extra_factor["embed.weight"] = -1.234567e-5;
  auto r = DiffAt(Synth("ref", Reference()), Synth("neg", b));
  ASSERT_TRUE(r.ok()) << r.status().message();
  const std::string text = RenderText(*r, false);
  const size_t at = text.find("embed.weight");
  ASSERT_NE(std::string::npos, at) << text;
  const std::string line = text.substr(at, text.find('\n', at) - at);
  EXPECT_NE(std::string::npos, line.find(" -1.23457e-05 ")) << line;
}

// The chart's x axis names its parameters (14 fit: every one, names over 24 bytes by their last 23).
TEST(UnseenClients, HtmlChartNamesItsParameters) {
  SynthSpec a = Reference(), b = testing::Config(1, 2, 2, "ds-4530", "local-mean");
  a.name_prefix = b.name_prefix = "module.model.";  // names of 25 to 37 bytes: over the 24 a tick shows
  auto r = DiffAt(Synth("ref", a), Synth("b", b));
  ASSERT_TRUE(r.ok()) << r.status().message();
  const std::string html = RenderHtml(*r);
  size_t ticks = 0;
  for (size_t at = html.find("class=\"tick\""); at != std::string::npos; at = html.find("class=\"tick\"", at + 1)) {
    ++ticks;
  }
  EXPECT_EQ(14u, ticks);
  EXPECT_NE(std::string::npos, html.find(">\u2026ayers.1.attn.qkv.weight</text>")) << "a long name keeps its tail";
  EXPECT_NE(std::string::npos, html.find(">\u2026el.layers.0.norm.weight</text>"));
}

}  // namespace
}  // namespace gradtrace::diff
