// Issue 24 item 2: a parameter larger than a window is compared window by
// window (windowed_compare.h) with the answers of the whole-parameter path.
// Each case diffs the same two sets twice, with a tiny window (kWindow, not a
// divisor of the parameters' 1024, 768 and 256 elements, so windows end inside
// slices and frames) and with windows off, and requires the same verdicts,
// exit code and report, numbers included bit for bit: both paths give
// FullSums the same blocks (metrics.h), whatever the windows.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "compare/diff_engine.h"
#include "load/window_gather.h"
#include "rank_file.h"
#include "slice_codec.h"
#include "synth_big.h"
#include "test_dirs.h"
#include "trace_writer.h"

namespace gradtrace::diff {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using testing::Config;
using testing::Reference;
using testing::Synth;

constexpr int64_t kWindow = 100;

Report WindowedDiff(const std::string& a, const std::string& b, int64_t window, DiffOptions o = {}) {
  o.window_elements = window;
  o.stream = false;  // the reassembling paths, windowed or whole (stream_compare_test.cc compares the streamed one)
  auto r = RunDiff(a, b, o);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(*r) : Report{};
}

// Numbers bit for bit (NaN equal to NaN), everything else exactly; `params` matched by name (their order follows
// the residuals).
void ExpectSameJson(const json& x, const json& y, const std::string& at) {
  if (x.is_number() && y.is_number()) {
    const double a = x.get<double>(), b = y.get<double>();
    EXPECT_TRUE(a == b || (std::isnan(a) && std::isnan(b))) << at << ": " << x << " vs " << y;
    return;
  }
  ASSERT_EQ(x.type(), y.type()) << at;
  if (x.is_object()) {
    ASSERT_EQ(x.size(), y.size()) << at;
    for (auto it = x.begin(); it != x.end(); ++it) {
      ASSERT_TRUE(y.contains(it.key())) << at << "." << it.key();
      if (it.key() == "params" && !it.value().empty() && it.value()[0].is_object()) {
        std::map<std::string, json> px, py;
        for (const json& p : it.value()) px[p["name"]] = p;
        for (const json& p : y[it.key()]) py[p["name"]] = p;
        ExpectSameJson(json(px), json(py), at + ".params");
      } else {
        ExpectSameJson(it.value(), y[it.key()], at + "." + it.key());
      }
    }
  } else if (x.is_array()) {
    ASSERT_EQ(x.size(), y.size()) << at;
    for (size_t i = 0; i < x.size(); ++i) ExpectSameJson(x[i], y[i], at + "[" + std::to_string(i) + "]");
  } else {
    EXPECT_EQ(x, y) << at;
  }
}

// Diffs a against b windowed and whole; returns the windowed report after checking they agree.
Report ExpectSameAnswers(const std::string& a, const std::string& b, DiffOptions o = {}, int64_t window = kWindow) {
  Report whole = WindowedDiff(a, b, 0, o), windowed = WindowedDiff(a, b, window, o);
  EXPECT_EQ(windowed.verdict, whole.verdict);
  EXPECT_EQ(windowed.ExitCode(), whole.ExitCode());
  EXPECT_EQ(windowed.summary, whole.summary);
  EXPECT_EQ(windowed.params.size(), whole.params.size());
  for (const ParamResult& w : windowed.params) {
    for (const ParamResult& p : whole.params) {
      if (p.name == w.name) {
        EXPECT_EQ(w.verdict, p.verdict) << p.name;
      }
    }
  }
  ExpectSameJson(json::parse(RenderJson(whole)), json::parse(RenderJson(windowed)), "report");
  return windowed;
}

const ParamResult& Param(const Report& r, const std::string& name) {
  for (const ParamResult& p : r.params) {
    if (p.name == name) return p;
  }
  ADD_FAILURE() << "no parameter " << name;
  return r.params.front();
}

bool HasFinding(const Report& r, const std::string& kind, const std::string& text) {
  for (const Finding& f : r.findings) {
    if (f.kind == kind && f.message.find(text) != std::string::npos) return true;
  }
  return false;
}

TEST(WindowedCompare, Zero2PartitionsAcrossRanksGiveTheWholeAnswers) {
  const std::string a = Synth("ref", Reference());
  const std::string b = Synth("zero2", Config(3, 1, 2, "mean", "local-mean"));  // partitions of 3 ranks cut params
  Report r = ExpectSameAnswers(a, b);
  EXPECT_EQ(r.verdict, "match") << r.summary;
  DiffOptions post;
  post.phase = pb::POST_REDUCE;
  ExpectSameAnswers(b, Synth("zero2-dp4", Config(4, 1, 2, "mean", "local-mean")), post);
}

TEST(WindowedCompare, DisagreeingReplicasAreFoundAsWhole) {
  const std::string a = Synth("ref", Reference());
  auto spec = Config(3, 1, 0, "mean", "local-mean");
  spec.disagree_rank = 2;
  Report r = ExpectSameAnswers(a, Synth("disagree", spec));
  EXPECT_TRUE(HasFinding(r, "replica", "B: replicas of 'embed.weight' disagree (rank 0 vs rank 2")) << r.summary;
}

TEST(WindowedCompare, PreReduceSumsOverRanksAndMicroStepsAsWhole) {
  auto spec_a = Config(2, 1, 0, "mean", "local-mean");
  spec_a.gas = 2;
  auto spec_b = Config(2, 2, 2, "ds-4530", "local-mean");
  spec_b.gas = 2;
  DiffOptions pre;
  pre.phase = pb::PRE_REDUCE;
  Report r = ExpectSameAnswers(Synth("a", spec_a), Synth("b", spec_b), pre);
  EXPECT_EQ(Param(r, "embed.weight").metrics.basis, Basis::kFull);
}

TEST(WindowedCompare, TruncatedSideGivesTheSameCoverageNote) {
  const std::string a = Synth("ref", Reference());
  const std::string b = Synth("zero2", Config(2, 1, 2, "mean", "local-mean"));
  const fs::path rank1 = fs::path(b) / RankFileName(1);
  ASSERT_TRUE(testing::TruncateFile(rank1.string(), fs::file_size(rank1) / 2).ok());
  Report r = ExpectSameAnswers(a, b);
  int partial = 0;
  for (const ParamResult& p : r.params) partial += p.note.find("B covers ") == 0;
  EXPECT_GT(partial, 0);
  EXPECT_NE(r.verdict, "match");
}

TEST(WindowedCompare, SketchAndStatsCapturesAsWhole) {
  const std::string full = Synth("full", Reference());
  auto sketch = Config(2, 2, 2, "ds-4530", "local-mean");
  sketch.capture = "sketch:64";
  auto stats = Config(2, 1, 0, "mean", "local-mean");
  stats.capture = "stats";
  const std::string sk = Synth("sketch", sketch), st = Synth("stats", stats);
  auto ref_sketch = Reference();
  ref_sketch.capture = "sketch:64";
  auto ref_stats = Reference();
  ref_stats.capture = "stats";
  // Mixed modes: the second pass reads the full side's values at the sketch positions, its moments.
  Report mixed = ExpectSameAnswers(full, sk);
  EXPECT_EQ(Param(mixed, "embed.weight").metrics.basis, Basis::kSketch);
  EXPECT_NEAR(Param(mixed, "embed.weight").metrics.scale, 2.0, 1e-5);
  Report moments = ExpectSameAnswers(full, st);
  EXPECT_EQ(Param(moments, "embed.weight").metrics.basis, Basis::kStats);
  ExpectSameAnswers(Synth("ref-sketch", ref_sketch), sk);
  ExpectSameAnswers(Synth("ref-stats", ref_stats), st);
}

TEST(WindowedCompare, ScaledAndMismatchedParametersAsWhole) {
  const std::string a = Synth("ref", Reference());
  auto spec = Config(2, 1, 0, "mean", "local-mean");
  spec.extra_factor = {{"layers.0.mlp.fc1.weight", 2.0}};
  spec.scramble = {"head.weight"};
  Report r = ExpectSameAnswers(a, Synth("b", spec));
  EXPECT_EQ(Param(r, "layers.0.mlp.fc1.weight").verdict, Verdict::kScaled);
  EXPECT_NEAR(Param(r, "layers.0.mlp.fc1.weight").metrics.scale, 2.0, 1e-6);
  EXPECT_EQ(Param(r, "head.weight").verdict, Verdict::kMismatch);
  EXPECT_EQ(r.ExitCode(), 1);
}

// Real chunking: records cut into frames mid-slice (synth_big.h), windows ending inside frames, dp replicas.
TEST(WindowedCompare, ChunkedReplicasAsWhole) {
  const auto [a, b] = testing::BigParamPair("chunked", 3'000'000, 2);
  Report r = ExpectSameAnswers(a, b, {}, 777'777);
  EXPECT_EQ(r.params[0].verdict, Verdict::kScaled);
  EXPECT_EQ(r.params[0].metrics.scale, 2.0);
  EXPECT_EQ(r.params[0].metrics.compared, 3'000'000);
}

// One fp32 parameter of `numel` elements, one FINAL record holding `slices` ({offset, count}) in that order
// (`apart`: a record per slice, bucket ids 0, 1, ...), values factor x (i % 1000) / 64.
std::string WriteSlices(const std::string& name, int64_t numel, const std::vector<std::pair<int64_t, int64_t>>& slices,
                        float factor = 1, pb::DType dtype = pb::FP32, bool apart = false) {
  const std::string dir = testing::FreshDir(name);
  fs::create_directories(dir);
  pb::RunInfo run;
  run.set_producer("test");
  run.set_run_id("slices");
  run.mutable_config()->set_world(1);
  run.mutable_config()->set_dp(1);
  run.mutable_config()->set_dtype(pb::FP32);
  pb::ParamInfo* p = run.add_params();
  p->set_id(0);
  p->set_name("w");
  p->add_shape(numel);
  p->set_numel(numel);
  p->set_dtype(pb::FP32);
  auto w = TraceWriter::Open((fs::path(dir) / RankFileName(0)).string(), run);
  EXPECT_TRUE(w.ok()) << w.status().message();
  pb::BucketRecord rec;
  rec.set_phase(pb::FINAL);
  for (const auto& [offset, count] : slices) {
    std::vector<double> v64(count);
    std::vector<float> v32(count);
    for (int64_t i = 0; i < count; ++i) v64[i] = v32[i] = factor * static_cast<float>((offset + i) % 1000) / 64;
    const void* data = dtype == pb::FP64 ? static_cast<const void*>(v64.data()) : v32.data();
    *rec.add_slices() = MakeSlice(run.params(0), offset, count, dtype, data, CaptureMode());
    if (apart) {
      EXPECT_TRUE((*w)->WriteBucket(rec).ok());
      rec.clear_slices();
      rec.set_bucket_id(rec.bucket_id() + 1);
    }
  }
  if (rec.slices_size() > 0) {
    EXPECT_TRUE((*w)->WriteBucket(rec).ok());
  }
  EXPECT_TRUE((*w)->Close().ok());
  return dir;
}

// The format lets a record hold a parameter's slices in any order; the windows need them ascending, so such a
// parameter is compared whole (diff_engine.cc WholeFallback) with the same answer.
TEST(WindowedCompare, SlicesOutOfElementOrderFallBackToWhole) {
  const std::string a = WriteSlices("a", 5000, {{2500, 2500}, {0, 2500}});
  const std::string b = WriteSlices("b", 5000, {{0, 5000}}, 2);
  Report r = ExpectSameAnswers(a, b);
  EXPECT_EQ(r.params[0].metrics.scale, 2.0);
  EXPECT_EQ(r.params[0].metrics.compared, 5000);
}

// Hostile: a declared numel of 2^40 with a few slices allocates neither numel nor a window per 100 elements.
TEST(WindowedCompare, HugeNumelWithFewSlicesCostsOnlyItsData) {
  const int64_t numel = int64_t{1} << 40;
  const std::string a = WriteSlices("a", numel, {{0, 10}, {numel / 2, 10}, {numel - 10, 10}});
  const std::string b = WriteSlices("b", numel, {{numel / 2 + 5, 10}}, 2);
  DiffOptions o;
  o.window_elements = kWindow;
  auto r = RunDiff(a, b, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->params[0].verdict, Verdict::kMissing);
  EXPECT_EQ(r->params[0].note, "A covers 30 of 1099511627776 elements");
}

// Hostile: many records, each one element far from the others, give as many windows; each window visits only the
// cursors with data in it (window_gather.h), not every record's.
TEST(WindowedCompare, ManyRecordsSpreadOverAHugeParameterStayLinear) {
  const int64_t numel = int64_t{1} << 40;
  std::vector<std::pair<int64_t, int64_t>> slices;
  for (int64_t k = 0; k < 20000; ++k) slices.emplace_back(k * 50'000'000, 1);
  const std::string a = WriteSlices("a", numel, slices, 1, pb::FP32, true);
  const std::string b = WriteSlices("b", numel, slices, 2, pb::FP32, true);
  DiffOptions o;
  o.window_elements = kWindow;
  auto r = RunDiff(a, b, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->params[0].note, "A covers 20000 of 1099511627776 elements");
}

// ... and out of element order it is refused, not reassembled whole.
TEST(WindowedCompare, HugeNumelOutOfOrderIsCorruption) {
  const int64_t numel = int64_t{1} << 40;
  const std::string a = WriteSlices("a", numel, {{numel / 2, 10}, {0, 10}});
  const std::string b = WriteSlices("b", numel, {{0, 10}});
  DiffOptions o;
  o.window_elements = kWindow;
  auto r = RunDiff(a, b, o);
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  EXPECT_EQ(m.rfind("parameter 'w': full slices out of element order within a record, and its 1099511627776 "
                    "elements are more than its frames hold (",
                    0),
            0u)
      << m;
  EXPECT_NE(m.find(" bytes): not reassembled"), std::string::npos) << m;
}

// fp64 values in a parameter recorded as fp32: float windows are gathered again in double.
TEST(WindowedCompare, Fp64SlicesWidenTheWindows) {
  const std::string a = WriteSlices("a", 5000, {{0, 2000}, {2000, 3000}}, 1, pb::FP64);
  const std::string b = WriteSlices("b", 5000, {{0, 5000}}, 3);
  Report r = ExpectSameAnswers(a, b);
  EXPECT_EQ(r.params[0].metrics.scale, 3.0);
}

// The gatherer alone: every window holds what the whole parameter holds there, whether boundary frames are kept
// (the default budget) or decoded again (budget 0).
TEST(WindowGather, WindowsHoldWhatTheWholeParameterHolds) {
  testing::BigParamSpec spec;
  spec.numel = 2'500'000;
  spec.dp = 2;
  const std::string dir = testing::FreshDir("big");
  ASSERT_TRUE(testing::WriteBigParamSet(dir, spec).ok());
  auto set = TraceSet::Load(dir);
  ASSERT_TRUE(set.ok()) << set.status().message();
  const auto frames = SelectFrames(*set, {0, pb::FINAL});
  ReaderCache cache;
  std::vector<SideValues> whole;
  ASSERT_TRUE(GatherParams(*set, frames, {0}, Combine::kReplicas, &cache, &whole).ok());
  for (uint64_t budget : {uint64_t{16} << 20, uint64_t{0}}) {
    WindowGather g(*set, frames, 0, Combine::kReplicas, true, &cache, budget);
    WindowValues w(true);
    ASSERT_TRUE(g.Start().ok());
    int windows = 0;
    for (int64_t lo = g.NextData(); lo < spec.numel; lo = g.NextData(), ++windows) {
      const int64_t hi = std::min(lo + 999'999, spec.numel);
      ASSERT_TRUE(g.Gather(lo, hi, true, &w).ok());
      ASSERT_TRUE(w.complete());
      for (int64_t i = 0; i < w.size(); i += 997) ASSERT_EQ(w.at(i), whole[0].at(lo + i)) << lo + i;
    }
    EXPECT_EQ(windows, 3);
    EXPECT_EQ(g.covered(), spec.numel);
    EXPECT_EQ(g.replicas().diff2, 0);
    EXPECT_GT(g.replicas().ref2, 0);  // rank 1 was compared with rank 0 in every window
  }
}

}  // namespace
}  // namespace gradtrace::diff
