// The one rule for trace-set file names (proto/rank_file.h).
#include "rank_file.h"

#include <gtest/gtest.h>

#include <climits>

namespace gradtrace {
namespace {

TEST(RankFile, NamesPadToFiveDigitsAndGrowBeyond) {
  EXPECT_EQ("rank-00000.gtrace", RankFileName(0));
  EXPECT_EQ("rank-00003.gtrace", RankFileName(3));
  EXPECT_EQ("rank-00010.gtrace", RankFileName(10));
  EXPECT_EQ("rank-99999.gtrace", RankFileName(99999));
  EXPECT_EQ("rank-100000.gtrace", RankFileName(100000));
  EXPECT_EQ("rank-2147483647.gtrace", RankFileName(INT_MAX));
}

TEST(RankFile, EveryNameParsesBackToItsRank) {
  for (int rank : {0, 1, 9, 10, 11, 99, 100, 9999, 10000, 99999, 100000, 123456, 999999, 1000000, INT_MAX}) {
    const auto back = ParseRankFileName(RankFileName(rank));
    ASSERT_TRUE(back.has_value()) << RankFileName(rank);
    EXPECT_EQ(rank, *back) << RankFileName(rank);
  }
}

// One spelling per rank: what no writer writes is no rank file, even when it reads as a number.
TEST(RankFile, OtherSpellingsAreRefused) {
  for (const char* name :
       {"rank-1.gtrace", "rank-0001.gtrace", "rank-000001.gtrace", "rank-010000.gtrace", "rank-0000010.gtrace",
        "rank-.gtrace", "rank-0000a.gtrace", "rank--0001.gtrace", "rank-+0001.gtrace", "rank- 0001.gtrace",
        "rank-00001.gtrace.tmp", "rank-00001.GTRACE", "Rank-00001.gtrace", "rank-00001", "rank-2147483648.gtrace",
        "rank-99999999999.gtrace", "x/rank-00001.gtrace", "notes.txt", ""}) {
    EXPECT_FALSE(ParseRankFileName(name).has_value()) << name;
  }
}

TEST(RankFile, ListersSkipOtherFilesAndReportMisnamedOnes) {
  auto member = RankFileMember("/d/set/rank-00010.gtrace");
  ASSERT_TRUE(member.ok());
  EXPECT_EQ(10, member->value());
  auto in_archive = RankFileMember("bug.gtpack:a/rank-00001.gtrace");
  ASSERT_TRUE(in_archive.ok());
  EXPECT_EQ(1, in_archive->value());
  for (const char* other : {"/d/set/notes.txt", "/d/set/rank-00001.gtrace.bak", "/d/set/t.gtrace", "/d/rank-x/a"}) {
    auto m = RankFileMember(other);
    ASSERT_TRUE(m.ok()) << other;
    EXPECT_FALSE(m->has_value()) << other;
  }
  auto bad = RankFileMember("/d/set/rank-10.gtrace");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(Status::Code::kInvalidArgument, bad.status().code());
  EXPECT_EQ(
      "/d/set/rank-10.gtrace: not a rank file name: a trace set's files are named rank-NNNNN.gtrace (the rank "
      "zero-padded to five digits, as every writer names them)",
      bad.status().message());
}

}  // namespace
}  // namespace gradtrace
