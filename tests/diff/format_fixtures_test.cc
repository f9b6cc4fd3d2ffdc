// Traces written by earlier writers (tests/fixtures/format-1.0 to -1.6,
// committed) keep reading, verifying and diffing with the same answers: 1.0
// files are scanned (the index became a catalogue in 1.1), 1.1 files lack the
// layout fields of 1.2, 1.2 files the replicate degree of 1.3, 1.3 files the
// precision chain and setup fingerprints of 1.4, 1.4 files the pipeline
// fields of 1.5, and none before 1.6 holds 1.6's records by reference (1.6's
// gradtrace-train set does).
#include <gtest/gtest.h>

#include <filesystem>

#include "compare/align.h"
#include "compare/diff_engine.h"
#include "test_dirs.h"
#include "trace_reader.h"

namespace gradtrace::diff {
namespace {
namespace fs = std::filesystem;

const std::string kFixtures = std::string(GRADTRACE_FIXTURES) + "/format-1.0";

struct Fixtures {
  std::string dir;
  int minor;
  int files;  // trace files under dir
};

class OldFormat : public ::testing::TestWithParam<Fixtures> {};

TEST_P(OldFormat, FilesOpenAndVerify) {
  int files = 0;
  for (const auto& set : fs::directory_iterator(GetParam().dir)) {
    if (!set.is_directory()) continue;
    for (const auto& f : fs::directory_iterator(set.path())) {
      if (f.path().extension() != ".gtrace") continue;
      const std::string path = f.path().string();
      auto r = TraceReader::Open(path);
      ASSERT_TRUE(r.ok()) << r.status().message();
      EXPECT_EQ(GetParam().minor, (*r)->minor_version()) << path;
      EXPECT_TRUE((*r)->has_index()) << path;
      EXPECT_EQ(GetParam().minor >= 1, (*r)->catalogued()) << path;
      EXPECT_TRUE(VerifyFile(path).ok()) << VerifyFile(path).message();
      // No layout before 1.2: every parameter's kind reads as unspecified; 1.2 records it.
      for (const pb::ParamInfo& p : (*r)->run_info().params()) {
        if (GetParam().minor < 2) {
          EXPECT_EQ(pb::PARAM_KIND_UNSPECIFIED, p.kind());
        } else {
          EXPECT_NE(pb::PARAM_KIND_UNSPECIFIED, p.kind()) << p.name();
        }
      }
      EXPECT_EQ(0, (*r)->run_info().config().replicate());
      // No 1.4 field before 1.4: no precision chain or initial-weight sketch; 1.4's synth sketches every weight.
      EXPECT_EQ(pb::DTYPE_UNSPECIFIED, (*r)->run_info().config().comm_dtype());
      for (const pb::ParamInfo& p : (*r)->run_info().params()) {
        EXPECT_EQ(GetParam().minor >= 4, p.init_sketch_size() > 0) << p.name();
        EXPECT_EQ(0, p.stages_size()) << p.name();  // 1.5's pipeline stages
      }
      EXPECT_EQ(0, (*r)->run_info().config().pp_stages());
      EXPECT_FALSE((*r)->run_info().config().has_pp_scale_grads());
      Frame frame;
      int buckets = 0;
      while ((*r)->Next(&frame)) {
        if (!frame.bucket) continue;
        ++buckets;
        if (GetParam().minor < 6) {
          EXPECT_EQ(0u, frame.bucket->values_from()) << path;
        }
      }
      EXPECT_TRUE((*r)->status().ok()) << (*r)->status().message();
      EXPECT_GT(buckets, 0) << path;
      ++files;
    }
  }
  EXPECT_EQ(GetParam().files, files);
}

TEST_P(OldFormat, DiffGivesTheIssue5248Answer) {
  const std::string& dir = GetParam().dir;
  auto r = RunDiff(dir + "/ref", dir + "/sp2", {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ("scaled", r->verdict);
  ASSERT_EQ(14u, r->params.size());
  for (const auto& p : r->params) EXPECT_NEAR(p.metrics.scale, 2.0, 1e-6) << p.name;
  auto sketch = RunDiff(dir + "/ref", dir + "/sketch", {});
  ASSERT_TRUE(sketch.ok()) << sketch.status().message();
  for (const auto& p : sketch->params) {
    EXPECT_EQ(Basis::kSketch, p.metrics.basis) << p.name;
    EXPECT_NEAR(p.metrics.scale, 2.0, 1e-6) << p.name;
  }
}

// 1.2's layout survives in a 1.3 reader: the expert-parallel fixture's expert
// gradients (averaged over edp, ep = 2) come out 2x with the cause named.
TEST(FormatFixtures, Version12To16LayoutNamesTheExpertDivisor) {
  for (const char* version : {"/format-1.2", "/format-1.3", "/format-1.4", "/format-1.5", "/format-1.6"}) {
    const std::string dir = std::string(GRADTRACE_FIXTURES) + version;
    auto r = RunDiff(dir + "/ref", dir + "/ep", {});
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ("scaled", r->verdict);
    ASSERT_FALSE(r->groups.empty());
    const Group& g = r->groups.front();
    ASSERT_TRUE(g.scale.has_value());
    EXPECT_NEAR(2.0, *g.scale, 1e-6);
    EXPECT_EQ(2, g.count);
    EXPECT_EQ("expert", g.param_kind);
    EXPECT_EQ(g.dimension, semantics::Dimension::kEp);
    EXPECT_EQ(g.cause, semantics::Cause::kReductionDivisor);
  }
}

INSTANTIATE_TEST_SUITE_P(Committed, OldFormat,
                         ::testing::Values(Fixtures{kFixtures, 0, 7},
                                           Fixtures{std::string(GRADTRACE_FIXTURES) + "/format-1.1", 1, 5},
                                           Fixtures{std::string(GRADTRACE_FIXTURES) + "/format-1.2", 2, 9},
                                           Fixtures{std::string(GRADTRACE_FIXTURES) + "/format-1.3", 3, 9},
                                           Fixtures{std::string(GRADTRACE_FIXTURES) + "/format-1.4", 4, 9},
                                           Fixtures{std::string(GRADTRACE_FIXTURES) + "/format-1.5", 5, 9},
                                           Fixtures{std::string(GRADTRACE_FIXTURES) + "/format-1.6", 6, 10}),
                         [](const ::testing::TestParamInfo<Fixtures>& info) {
                           return "Version1" + std::to_string(info.param.minor);
                         });

// The same run written by today's writer and by 1.0's: every phase compares
// equal, so old and new traces can be diffed against each other.
TEST(FormatFixtures, Version10AndTodaysWriterOfOneRunMatchInEveryPhase) {
  const std::string fresh = testing::Synth("sp2", testing::Config(1, 2, 2, "ds-4530", "local-mean"));
  auto reader = TraceReader::Open(fresh + "/rank-00000.gtrace");
  ASSERT_TRUE(reader.ok());
  EXPECT_TRUE((*reader)->catalogued());
  for (pb::Phase phase : {pb::FINAL, pb::POST_REDUCE, pb::PRE_REDUCE}) {
    DiffOptions o;
    o.phase = phase;
    auto r = RunDiff(kFixtures + "/sp2", fresh, o);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ("match", r->verdict) << PhaseName(phase) << ": " << r->summary;
    EXPECT_EQ(14u, r->params.size());
  }
}

}  // namespace
}  // namespace gradtrace::diff
