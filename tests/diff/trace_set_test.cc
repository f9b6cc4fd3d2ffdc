#include "load/trace_set.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "rank_file.h"
#include "test_dirs.h"
#include "trace_reader.h"
#include "trace_writer.h"

namespace gradtrace::diff {
namespace {
namespace fs = std::filesystem;
using testing::Config;
using testing::Synth;

std::string RankPath(const std::string& dir, int r) { return (fs::path(dir) / RankFileName(r)).string(); }

TEST(TraceSet, LoadsCompleteSet) {
  std::string dir = Synth("b", Config(2, 2, 2, "ds-4530", "local-mean"));
  auto set = TraceSet::Load(dir);
  ASSERT_TRUE(set.ok()) << set.status().message();
  EXPECT_EQ(set->world(), 4);
  EXPECT_FALSE(set->truncated());
  EXPECT_EQ(set->config().sp(), 2);
  EXPECT_FALSE(set->frames().empty());
  EXPECT_EQ(set->GroupMembers(3, "sdp"), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(set->GroupMembers(3, "sp"), (std::vector<int>{2, 3}));
}

TEST(TraceSet, MissingRankNamesTheFile) {
  std::string dir = Synth("b", Config(2, 2, 0, "mean", "local-mean"));
  fs::remove(RankPath(dir, 2));
  auto set = TraceSet::Load(dir);
  ASSERT_FALSE(set.ok());
  EXPECT_NE(set.status().message().find("rank-00002.gtrace: missing (rank 2 of world 4)"), std::string::npos)
      << set.status().message();
}

// Issue 21: one rule for rank file names (proto/rank_file.h). rank-1.gtrace was read as rank 1 by the diff and
// listed by gradtrace-inspect; no writer names a file so. It is now refused by name, not silently left out.
TEST(TraceSet, MisnamedRankFileIsRefusedByName) {
  std::string dir = Synth("b", Config(2, 1, 0, "mean", "local-mean"));
  fs::rename(RankPath(dir, 1), fs::path(dir) / "rank-1.gtrace");
  auto set = TraceSet::Load(dir);
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.status().message(), (fs::path(dir) / "rank-1.gtrace").string() +
                                        ": not a rank file name: a trace set's files are named rank-NNNNN.gtrace (the "
                                        "rank zero-padded to five digits, as every writer names them)");
}

// A rank given twice (an archive can hold a member twice) is refused.
TEST(TraceSet, DuplicateRank) {
  std::string dir = Synth("b", Config(2, 1, 0, "mean", "local-mean"));
  std::vector<TraceSource> sources = {TraceSource::File(RankPath(dir, 0)), TraceSource::File(RankPath(dir, 1)),
                                      TraceSource::File(RankPath(dir, 1))};
  auto set = TraceSet::LoadSources(dir, std::move(sources), LoadOptions{});
  ASSERT_FALSE(set.ok());
  EXPECT_NE(set.status().message().find("duplicate rank 1"), std::string::npos) << set.status().message();
}

TEST(TraceSet, MixedRunsAreRefused) {
  auto spec = Config(2, 1, 0, "mean", "local-mean");
  spec.run_id = "run-x";
  std::string x = Synth("x", spec);
  spec.run_id = "run-y";
  std::string y = Synth("y", spec);
  fs::copy_file(RankPath(y, 1), RankPath(x, 1), fs::copy_options::overwrite_existing);
  auto set = TraceSet::Load(x);
  ASSERT_FALSE(set.ok());
  const std::string& m = set.status().message();
  EXPECT_EQ(m.rfind(RankPath(x, 1), 0), 0u) << m;
  EXPECT_NE(m.find("mixed runs"), std::string::npos) << m;
}

// Issue 20: group members index the set's ranks. With the world recorded the reader refuses a member outside
// it (proto/validate.cc); with the world unrecorded (0) the set's rank files bound it, known only here.
TEST(TraceSet, GroupMemberOutsideAnUnrecordedWorldNamesTheFile) {
  std::string dir = Synth("b", Config(2, 1, 0, "mean", "local-mean"));
  std::string group;
  for (int r = 0; r < 2; ++r) {
    pb::RunInfo run;
    {
      auto reader = TraceReader::Open(RankPath(dir, r));
      ASSERT_TRUE(reader.ok()) << reader.status().message();
      run = (*reader)->run_info();
    }
    run.mutable_config()->set_world(0);
    ASSERT_GT(run.groups_size(), 0);
    group = run.groups(0).name();
    if (r == 1) run.mutable_groups(0)->add_ranks(5);
    WriterOptions o;
    o.overwrite = true;
    auto w = TraceWriter::Open(RankPath(dir, r), run, o);
    ASSERT_TRUE(w.ok()) << w.status().message();
    ASSERT_TRUE((*w)->Close().ok());
  }
  auto set = TraceSet::Load(dir);
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.status().message(), RankPath(dir, 1) + ": group '" + group + "': rank 5 outside world 2");
}

LoadOptions ScanEverything() {
  LoadOptions o;
  o.use_index = false;
  return o;
}

// Every FrameRef field and every StepInfo, for comparing two catalogues.
std::vector<std::string> CatalogueLines(const TraceSet& set) {
  std::vector<std::string> out;
  for (const FrameRef& f : set.frames()) {
    std::string ids;
    for (int32_t id : f.param_ids) ids += std::to_string(id) + ",";
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "frame r%d @%llu s%lld m%d p%d b%d g=%s raw=%llu n=%lld po=%lld pc=%lld d=%.17g ids=", f.rank,
                  static_cast<unsigned long long>(f.offset), static_cast<long long>(f.step), f.micro_step,
                  static_cast<int>(f.phase), f.bucket_id, f.group.c_str(), static_cast<unsigned long long>(f.raw_bytes),
                  static_cast<long long>(f.bucket_numel), static_cast<long long>(f.partition_offset),
                  static_cast<long long>(f.partition_count), f.divisor);
    out.push_back(buf + ids);
  }
  for (const RankStep& s : set.steps()) out.push_back("step r" + std::to_string(s.rank) + " " + s.info.DebugString());
  return out;
}

// Issue 12: format 1.1 files are catalogued from their index, without
// decompressing data frames; the result is what a full scan finds.
TEST(TraceSet, CatalogueFromTheIndexEqualsAFullScan) {
  std::string dir = Synth("b", Config(2, 2, 2, "ds-4530", "local-mean"));
  auto indexed = TraceSet::Load(dir);
  auto scanned = TraceSet::Load(dir, ScanEverything());
  ASSERT_TRUE(indexed.ok()) << indexed.status().message();
  ASSERT_TRUE(scanned.ok()) << scanned.status().message();
  EXPECT_GT(indexed->frames().size(), 10u);
  EXPECT_FALSE(indexed->steps().empty());
  EXPECT_EQ(CatalogueLines(*scanned), CatalogueLines(*indexed));
}

TEST(TraceSet, CataloguedLoadDoesNotReadDataFrames) {
  std::string dir = Synth("b", Config(2, 1, 0, "mean", "local-mean"));
  auto before = TraceSet::Load(dir);
  ASSERT_TRUE(before.ok());
  std::string victim = RankPath(dir, 1);
  ASSERT_TRUE(testing::FlipByte(victim, fs::file_size(victim) / 2).ok());
  auto after = TraceSet::Load(dir);
  ASSERT_TRUE(after.ok()) << after.status().message();
  EXPECT_EQ(CatalogueLines(*before), CatalogueLines(*after));
}

TEST(TraceSet, CorruptFrameIsAnErrorNamingTheFile) {
  std::string dir = Synth("b", Config(2, 1, 0, "mean", "local-mean"));
  std::string victim = RankPath(dir, 1);
  ASSERT_TRUE(testing::FlipByte(victim, fs::file_size(victim) / 2).ok());
  auto set = TraceSet::Load(dir, ScanEverything());
  ASSERT_FALSE(set.ok());
  EXPECT_NE(set.status().message().find(victim), std::string::npos) << set.status().message();
  EXPECT_EQ(set.status().message().find('\n'), std::string::npos);
}

TEST(TraceSet, TruncatedFileKeepsCompleteFrames) {
  std::string dir = Synth("b", Config(2, 1, 0, "mean", "local-mean"));
  std::string victim = RankPath(dir, 1);
  auto full = TraceSet::Load(dir);
  ASSERT_TRUE(full.ok());
  size_t frames_before = full->frames().size();
  ASSERT_TRUE(testing::TruncateFile(victim, fs::file_size(victim) * 6 / 10).ok());
  auto set = TraceSet::Load(dir);
  ASSERT_TRUE(set.ok()) << set.status().message();
  EXPECT_TRUE(set->truncated());
  EXPECT_TRUE(set->ranks()[1].truncated);
  EXPECT_LT(set->frames().size(), frames_before);
  EXPECT_GT(set->frames().size(), frames_before / 2);
}

TEST(TraceSet, EmptyDirectoryAndNonDirectory) {
  std::string dir = testing::FreshDir("empty");
  fs::create_directories(dir);
  auto set = TraceSet::Load(dir);
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.status().message(), dir + ": no rank-NNNNN.gtrace files");
  auto none = TraceSet::Load(dir + "/nope");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().message(), dir + "/nope: no such directory");
}

}  // namespace
}  // namespace gradtrace::diff
