// Large frames' middles written with O_DIRECT (direct_write.h): the file is
// byte for byte the one stdio writes, on every frame layout around the 4 KiB
// blocks, and reads back whole.
#include "direct_write.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "slice_codec.h"
#include "test_util.h"
#include "trace_reader.h"
#include "trace_writer.h"

namespace gradtrace {
namespace {

TEST(DirectWrites, MiddleIsTheWholeBlocksOfALargeRange) {
  constexpr uint64_t kB = DirectWrites::kBlock;
  DirectWrites::Middle m = DirectWrites::MiddleOf(100, 1 << 20);
  EXPECT_EQ(m.lo, kB);
  EXPECT_EQ(m.hi, (100 + (1 << 20)) / kB * kB);
  m = DirectWrites::MiddleOf(3 * kB, 1 << 20);  // aligned both ends
  EXPECT_EQ(m.lo, 3 * kB);
  EXPECT_EQ(m.hi, 3 * kB + (1 << 20));
  m = DirectWrites::MiddleOf(100, DirectWrites::kMinimum);  // under kMinimum once aligned: none
  EXPECT_EQ(m.lo, m.hi);
}

// Whether `dir` takes O_DIRECT (a probe file opened as the writer opens its own).
bool TakesDirect(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return false;
  DirectWrites d;
  d.Open(fd);
  const bool ok = d.enabled();
  ::close(fd);
  ::unlink(path.c_str());
  return ok;
}

// Records of random (incompressible) values of several sizes: frames from a few bytes to 4 MiB, starting at every
// kind of offset within a block, a step frame between each.
void WriteTrace(const std::string& path, bool direct, uint64_t* direct_bytes) {
  pb::RunInfo run = testing::SmallRun();
  *run.mutable_params(0) = testing::Param(0, "embed.weight", {5, 1 << 20});
  WriterOptions o;
  o.direct_io = direct;
  auto w = TraceWriter::Open(path, run, o);
  ASSERT_TRUE(w.ok()) << w.status().message();
  const pb::ParamInfo& p = run.params(0);
  uint32_t seed = 1;
  for (int64_t n :
       {int64_t{7}, int64_t{1} << 20, int64_t{300001}, int64_t{5} << 20, int64_t{65537}, int64_t{1} << 18}) {
    ASSERT_TRUE((*w)->WriteStep(testing::Step(seed)).ok());
    pb::BucketRecord r;
    r.set_step(seed);
    r.set_phase(pb::PRE_REDUCE);
    r.set_group("sp");
    const std::vector<float> v = testing::Floats(static_cast<size_t>(n), seed++);
    *r.add_slices() = MakeSlice(p, 0, n, pb::FP32, v.data(), CaptureMode{});
    ASSERT_TRUE((*w)->WriteBucket(r).ok());
  }
  ASSERT_TRUE((*w)->Close().ok());
  *direct_bytes = (*w)->direct_bytes();
}

TEST(DirectWrites, TheFileIsWhatStdioWrites) {
  testing::TempDir dir;
  uint64_t direct = 0, none = 0;
  WriteTrace(dir.File("direct.gtrace"), true, &direct);
  WriteTrace(dir.File("stdio.gtrace"), false, &none);
  EXPECT_EQ(none, 0u);
  if (TakesDirect(dir.File("probe"))) {
    EXPECT_GT(direct, uint64_t{16} << 20);  // most of the 4 MiB frames' bytes
  }
  const std::string a = testing::ReadBytes(dir.File("direct.gtrace")), b = testing::ReadBytes(dir.File("stdio.gtrace"));
  EXPECT_GT(a.size(), uint64_t{20} << 20);
  EXPECT_TRUE(a == b);
  EXPECT_TRUE(VerifyFile(dir.File("direct.gtrace")).ok()) << VerifyFile(dir.File("direct.gtrace")).message();
}

}  // namespace
}  // namespace gradtrace
