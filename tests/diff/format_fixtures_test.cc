// Traces written by format 1.0's writer (tests/fixtures/format-1.0, committed)
// keep reading, verifying and diffing with the same answers (issue 12: the
// index became a catalogue in 1.1; old files are scanned instead).
#include <gtest/gtest.h>

#include <filesystem>

#include "align.h"
#include "diff_engine.h"
#include "test_dirs.h"
#include "trace_reader.h"

namespace gradtrace::diff {
namespace {
namespace fs = std::filesystem;

const std::string kFixtures = std::string(GRADTRACE_FIXTURES) + "/format-1.0";

TEST(FormatFixtures, Version10FilesOpenVerifyAndAreScanned) {
  int files = 0;
  for (const auto& set : fs::directory_iterator(kFixtures)) {
    if (!set.is_directory()) continue;
    for (const auto& f : fs::directory_iterator(set.path())) {
      const std::string path = f.path().string();
      auto r = TraceReader::Open(path);
      ASSERT_TRUE(r.ok()) << r.status().message();
      EXPECT_EQ(0, (*r)->minor_version()) << path;
      EXPECT_TRUE((*r)->has_index()) << path;
      EXPECT_FALSE((*r)->catalogued()) << path;
      EXPECT_TRUE(VerifyFile(path).ok()) << VerifyFile(path).message();
      ++files;
    }
  }
  EXPECT_EQ(7, files);
}

TEST(FormatFixtures, Version10DiffGivesTheIssue5248Answer) {
  auto r = RunDiff(kFixtures + "/ref", kFixtures + "/sp2", {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ("scaled", r->verdict);
  ASSERT_EQ(14u, r->params.size());
  for (const auto& p : r->params) EXPECT_NEAR(p.metrics.scale, 2.0, 1e-6) << p.name;
  auto sketch = RunDiff(kFixtures + "/ref", kFixtures + "/sketch", {});
  ASSERT_TRUE(sketch.ok()) << sketch.status().message();
  for (const auto& p : sketch->params) {
    EXPECT_EQ(Basis::kSketch, p.metrics.basis) << p.name;
    EXPECT_NEAR(p.metrics.scale, 2.0, 1e-6) << p.name;
  }
}

// The same run written by today's writer (1.1, catalogued) and by 1.0's: every
// phase compares equal, so old and new traces can be diffed against each other.
TEST(FormatFixtures, Version10AndVersion11OfOneRunMatchInEveryPhase) {
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
