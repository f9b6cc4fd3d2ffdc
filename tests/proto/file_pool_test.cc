// Rank files opened on demand under one bound (file_pool.h, issue 42): more readers than the budget all read
// every frame, with never more than the budget open; a file replaced between reads is refused by name.
#include "file_pool.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "test_util.h"
#include "trace_reader.h"

namespace gradtrace {
namespace {

namespace fs = std::filesystem;

class FilePool : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("gradtrace_file_pool_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    SetFilePoolBudgetForTesting(4);
  }
  void TearDown() override {
    SetFilePoolBudgetForTesting(0);
    fs::remove_all(dir_);
  }
  std::string Path(int k) const { return (dir_ / ("rank-" + std::to_string(k) + ".gtrace")).string(); }
  fs::path dir_;
};

// Reads every frame the index lists through `r` (each read reopens its file when the pool closed it).
int Frames(TraceReader& r) {
  EXPECT_TRUE(r.has_index());
  int n = 0;
  for (const auto& e : r.index().entries()) {
    Frame f;
    const Status s = r.ReadAt(e.offset(), &f);
    EXPECT_TRUE(s.ok()) << s.message();
    n += s.ok();
  }
  return n;
}

TEST_F(FilePool, MoreReadersThanTheBudgetReadEverythingWithinIt) {
  std::vector<std::unique_ptr<TraceReader>> readers;
  for (int k = 0; k < 12; ++k) {
    testing::WriteSmallTrace(Path(k));
    auto r = TraceReader::Open(Path(k));
    ASSERT_TRUE(r.ok()) << r.status().message();
    readers.push_back(std::move(*r));
    EXPECT_LE(FilePoolOpenFiles(), 4u);
  }
  const int each = Frames(*readers[0]);
  EXPECT_GT(each, 0);
  for (int pass = 0; pass < 2; ++pass) {  // each reader's file closed and reopened, twice over
    for (auto& r : readers) {
      EXPECT_EQ(Frames(*r), each);
      EXPECT_LE(FilePoolOpenFiles(), 4u);
    }
  }
  readers.clear();
  EXPECT_EQ(FilePoolOpenFiles(), 0u);
}

TEST_F(FilePool, AFileReplacedBetweenReadsIsRefusedByName) {
  testing::WriteSmallTrace(Path(0), 2);
  auto r = TraceReader::Open(Path(0));
  ASSERT_TRUE(r.ok()) << r.status().message();
  // Four other readers push the first one's file out of the pool.
  std::vector<std::unique_ptr<TraceReader>> others;
  for (int k = 1; k <= 4; ++k) {
    testing::WriteSmallTrace(Path(k));
    others.push_back(std::move(*TraceReader::Open(Path(k))));
  }
  fs::remove(Path(0));
  testing::WriteSmallTrace(Path(0), 3);  // another file at that path
  Frame f;
  const Status s = (*r)->ReadAt((*r)->index().entries(0).offset(), &f);
  EXPECT_EQ(s.message().rfind(Path(0) + ": changed since it was first opened", 0), 0u) << s.message();
}

}  // namespace
}  // namespace gradtrace
