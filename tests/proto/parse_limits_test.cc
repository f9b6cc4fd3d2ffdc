// Limits that hold while parsing a frame payload (parse_limits.h): the
// pre-pass counts exactly what the parse would create, legitimate frames at
// the format's maxima pass, and the hostile files of issue 12 are refused
// before the parse, within a few frame buffers of memory.
#include "parse_limits.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zstd.h>

#include <fstream>

#include "test_util.h"

// ASan and TSan reserve terabytes of address space up front: no RLIMIT_AS there.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define GT_RESERVING_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define GT_RESERVING_SANITIZER 1
#endif
#endif

namespace gradtrace {
namespace {

ParseCost Measure(const google::protobuf::Message& m, const std::string& bytes) {
  ParseCost cost;
  EXPECT_TRUE(MeasureParse(m.GetDescriptor(), bytes, &cost));
  return cost;
}

// --- counting --------------------------------------------------------------------

TEST(MeasureParseTest, CountsSubMessagesOfARealRecord) {
  pb::BucketRecord rec = testing::Bucket(testing::SmallRun(), 1, 0, pb::FINAL);
  pb::Slice stats = rec.slices(0);
  stats.mutable_stats()->set_count(128);
  *rec.add_slices() = stats;
  ParseCost cost = Measure(rec, rec.SerializeAsString());
  EXPECT_EQ(4, cost.objects);  // two slices, each with its payload message
  EXPECT_EQ(0, cost.repeated_scalar_bytes);
}

TEST(MeasureParseTest, CountsRunInfoParamsGroupsMapEntriesAndPackedNumbers) {
  pb::RunInfo run = testing::SmallRun();                   // config, 1 group of 2 ranks, 2 params ([16, 8] and [8])
  (*run.mutable_extra())["ds_config"] = "{}";              // a map entry
  (*run.mutable_config()->mutable_extra())["zero"] = "1";  // another, inside Config
  ParseCost cost = Measure(run, run.SerializeAsString());
  EXPECT_EQ(1 + 1 + 2 + 1 + 1, cost.objects);
  EXPECT_EQ(2 * 4 + 3 * 8, cost.repeated_scalar_bytes);  // int32 ranks, int64 dims
}

TEST(MeasureParseTest, CountsUnknownFieldsAndUnpackedNumbers) {
  // StepInfo{step: 1} followed by: an unknown varint (field 9), an unknown
  // string (field 10), an unknown group (field 11) holding a varint, and the
  // known field 2 (int32) sent with the wrong wire type, which the parser keeps
  // as unknown too.
  const std::string bytes("\x08\x01\x48\x05\x52\x02hi\x5b\x08\x01\x5c\x15\x00\x00\x00\x00", 17);
  pb::StepInfo step;
  ASSERT_TRUE(step.ParseFromString(bytes));
  EXPECT_EQ(1, step.step());
  EXPECT_EQ(4, step.GetReflection()->GetUnknownFields(step).field_count());
  EXPECT_EQ(5, Measure(step, bytes).objects);  // 4 unknown fields + the one inside the group

  // Unpacked repeated numbers, as older writers may send them: 3 positions.
  const std::string positions("\x10\x01\x10\x02\x10\x03", 6);
  pb::SketchPayload sk;
  ASSERT_TRUE(sk.ParseFromString(positions));
  EXPECT_EQ(3, sk.positions_size());
  EXPECT_EQ(3 * 8, Measure(sk, positions).repeated_scalar_bytes);
}

TEST(MeasureParseTest, MalformedWireDataIsCorruption) {
  for (const std::string& bad : {std::string("\xff\xff\xff", 3), std::string("\x32\x05\x08", 3),  // length past end
                                 std::string("\x00\x00", 2),                                      // field 0
                                 std::string("\x5b\x08\x01", 3),                                  // unterminated group
                                 std::string("\x5c", 1)}) {                                       // stray END_GROUP
    pb::BucketRecord rec;
    ParseCost cost;
    EXPECT_FALSE(MeasureParse(rec.GetDescriptor(), bad, &cost)) << ::testing::PrintToString(bad);
    Status s = ParseBounded(bad, ParseLimitsFor(format::FrameType::kBucketRecord), &rec);
    EXPECT_EQ(Status::Code::kCorruption, s.code());
    EXPECT_EQ("cannot parse BucketRecord payload (" + std::to_string(bad.size()) + " bytes)", s.message());
  }
}

// Issue 42: invalid UTF-8 in a string field printed 2-4 "[libprotobuf ERROR ...]" lines on stderr before the
// one-line error. protobuf's reason is now part of that line, and nothing else reaches stderr.
TEST(MeasureParseTest, InvalidUtf8IsOneErrorNamingTheFieldAndNothingOnStderr) {
  const std::string bad("\x0a\x02\xff\xfe", 4);  // RunInfo.producer = "\xff\xfe"
  pb::RunInfo run;
  ::testing::internal::CaptureStderr();
  Status s = ParseBounded(bad, ParseLimitsFor(format::FrameType::kRunInfo), &run);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(Status::Code::kCorruption, s.code());
  EXPECT_EQ(
      "cannot parse RunInfo payload (4 bytes): String field 'gradtrace.pb.RunInfo.producer' contains invalid UTF-8 "
      "data when parsing a protocol buffer",
      s.message());
  EXPECT_EQ("", err);
  // The next parse on this thread starts with no reason of its own.
  const std::string cut(
      "\x0a\x05"
      "ab",
      4);
  s = ParseBounded(cut, ParseLimitsFor(format::FrameType::kRunInfo), &run);
  EXPECT_EQ("cannot parse RunInfo payload (4 bytes)", s.message());
}

TEST(MeasureParseTest, GroupsNestedDeeperThanProtobufAllowsAreCorruption) {
  std::string deep;
  for (int i = 0; i < 101; ++i) deep += "\x5b";  // start group 11
  for (int i = 0; i < 101; ++i) deep += "\x5c";  // end group 11
  pb::StepInfo step;
  EXPECT_FALSE(step.ParseFromString(deep));
  ParseCost cost;
  EXPECT_FALSE(MeasureParse(step.GetDescriptor(), deep, &cost));
}

// --- legitimate frames at the format's maxima --------------------------------------

TEST(ParseLimitsTest, RunInfoWithTheMostParamsPasses) {
  pb::RunInfo run;
  run.mutable_params()->Reserve(format::kMaxParams);
  for (int64_t i = 0; i < format::kMaxParams; ++i) {
    pb::ParamInfo* p = run.add_params();
    p->set_id(static_cast<int32_t>(i));
    p->set_name("p");
    p->add_shape(2);
    p->set_numel(2);
    p->set_dtype(pb::FP32);
  }
  pb::RunInfo parsed;
  Status s = ParseBounded(run.SerializeAsString(), ParseLimitsFor(format::FrameType::kRunInfo), &parsed);
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(format::kMaxParams, parsed.params_size());
}

TEST(ParseLimitsTest, IndexFrameWithTheMostEntriesPasses) {
  pb::Index index;
  index.mutable_entries()->Reserve(format::kIndexEntriesPerFrame);
  for (int64_t i = 0; i < format::kIndexEntriesPerFrame; ++i) index.add_entries()->set_offset(100 + i);
  pb::Index parsed;
  Status s = ParseBounded(index.SerializeAsString(), ParseLimitsFor(format::FrameType::kIndex), &parsed);
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(format::kIndexEntriesPerFrame, parsed.entries_size());
}

TEST(ParseLimitsTest, LargestSketchPasses) {
  // A sketch filling a frame: 1-byte positions, 8-byte values.
  pb::BucketRecord rec;
  pb::SketchPayload* sk = rec.add_slices()->mutable_sketch();
  const int n = static_cast<int>((format::kMaxFramePayload - 64) / 10);
  for (int i = 0; i < n; ++i) {
    sk->add_positions(i % 100);
    sk->add_values(0.5);
  }
  const std::string bytes = rec.SerializeAsString();
  ASSERT_LE(bytes.size(), format::kMaxFramePayload);
  ParseCost cost = Measure(rec, bytes);
  EXPECT_EQ(int64_t{16} * n, cost.repeated_scalar_bytes);
  EXPECT_LE(cost.repeated_scalar_bytes, format::kMaxRepeatedScalarBytes);
}

// --- issue 12: hostile files ----------------------------------------------------------

// `unit` repeated to `size` bytes, after `head`.
std::string Fill(const std::string& head, const std::string& unit, size_t size) {
  std::string s = head;
  s.reserve(size);
  while (s.size() + unit.size() <= size) s += unit;
  return s;
}

// A zstd-compressed frame of `type` whose raw payload is `raw`: a few KB on disk.
std::string ZstdFrame(format::FrameType type, const std::string& raw) {
  std::string z(ZSTD_compressBound(raw.size()), '\0');
  z.resize(ZSTD_compress(z.data(), z.size(), raw.data(), raw.size(), 1));
  return testing::EncodeFrame(static_cast<uint8_t>(type), 1, z, static_cast<uint32_t>(raw.size()));
}

long VmSizeBytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmSize:", 0) == 0) return std::stol(line.substr(7)) * 1024;
  }
  return -1;
}

std::string Describe(const Status& s) {
  static const char* kNames[] = {"Ok",      "IoError", "Corruption", "Truncated", "LimitExceeded", "InvalidArgument",
                                 "Mismatch"};
  return std::string(kNames[static_cast<int>(s.code())]) + ": " + s.message();
}

// Runs `fn` in a child process whose address space may grow by `budget`
// bytes at most (setrlimit(RLIMIT_AS)) and returns Describe() of its status,
// or how the child died: a reader that allocates per object fails here.
// Sanitizer builds that reserve address space run `fn` in-process.
template <typename F>
std::string ReadWithin(size_t budget, F fn) {
#ifdef GT_RESERVING_SANITIZER
  (void)budget;
  return Describe(fn());
#else
  int fds[2];
  if (pipe(fds) != 0) return "pipe failed";
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    const rlim_t cap = static_cast<rlim_t>(VmSizeBytes()) + budget;
    rlimit rl{cap, cap};
    setrlimit(RLIMIT_AS, &rl);
    std::string out;
    try {
      out = Describe(fn());
    } catch (const std::bad_alloc&) {  // the child must never return into gtest
      out = "out of memory (std::bad_alloc)";
    }
    ssize_t w = write(fds[1], out.data(), out.size());
    _exit(w == static_cast<ssize_t>(out.size()) ? 0 : 1);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) return "child killed by signal " + std::to_string(WTERMSIG(status));
  if (WEXITSTATUS(status) != 0) return "child exited with status " + std::to_string(WEXITSTATUS(status));
  return out;
#endif
}

// Reading the whole hostile frame costs the 64 MiB payload buffer plus a few
// KB; the unbounded parse needed 2.7-3.2 GB.
constexpr size_t kBudget = 256u << 20;

class Issue12Test : public ::testing::Test {
 protected:
  std::string At(uint64_t offset) const { return path_ + ": offset " + std::to_string(offset) + ": "; }
  // VerifyFile(path_), as `gradtrace-inspect --verify` runs it, within kBudget.
  std::string Verify() {
    return ReadWithin(kBudget, [&] { return VerifyFile(path_); });
  }

  testing::TempDir dir_;
  std::string path_ = dir_.File("rank-00000.gtrace");
  const size_t kRaw = format::kMaxFramePayload;
};

// Issue 12: a 5.7 KB file of empty sub-messages made --verify use 3.2 GB
// through RunInfo (33554432 empty ParamInfo, field 10).
TEST_F(Issue12Test, RunInfoOfEmptySubMessages) {
  const std::string file =
      testing::FileHeader() + ZstdFrame(format::FrameType::kRunInfo, Fill("", std::string("\x52\x00", 2), kRaw));
  ASSERT_LT(file.size(), 16u << 10);
  testing::WriteBytes(path_, file);
  EXPECT_EQ("LimitExceeded: " + At(16) + "RunInfo payload would create 33554432 protobuf objects (limit 1114112)",
            Verify());
}

// Issue 12, the same through StepInfo: it has no sub-messages, but 33554432
// unknown length-delimited fields (field 15) would each be kept.
TEST_F(Issue12Test, StepInfoOfUnknownFields) {
  const std::string prefix = testing::CraftedPrefix();
  testing::WriteBytes(path_,
                      prefix + ZstdFrame(format::FrameType::kStepInfo, Fill("", std::string("\x7a\x00", 2), kRaw)));
  EXPECT_EQ(
      "LimitExceeded: " + At(prefix.size()) + "StepInfo payload would create 33554432 protobuf objects (limit 65536)",
      Verify());
}

// Issue 12, through BucketRecord: 33554432 empty slices (field 6).
TEST_F(Issue12Test, BucketRecordOfEmptySlices) {
  const std::string prefix = testing::CraftedPrefix();
  testing::WriteBytes(path_,
                      prefix + ZstdFrame(format::FrameType::kBucketRecord, Fill("", std::string("\x32\x00", 2), kRaw)));
  EXPECT_EQ("LimitExceeded: " + At(prefix.size()) +
                "BucketRecord payload would create 33554432 protobuf objects (limit 2162688)",
            Verify());
  // A reader stops at the frame, having returned the ones before it (none).
  testing::ReadResult r = testing::ReadAll(path_);
  EXPECT_EQ(Status::Code::kLimitExceeded, r.status.code());
  EXPECT_TRUE(r.messages.empty());
  EXPECT_EQ(prefix.size(), r.stop_offset);
}

// Issue 12: a bucket holding one sketch whose packed positions are 60 MiB of
// zero bytes: 8 bytes in memory per byte on disk.
TEST_F(Issue12Test, PackedPositionsOfZeroBytes) {
  const size_t n = 60u << 20;
  auto len = [](size_t v) {  // a varint
    std::string s;
    for (; v >= 0x80; v >>= 7) s += static_cast<char>(v | 0x80);
    return s + static_cast<char>(v);
  };
  const std::string positions = "\x12" + len(n) + std::string(n, '\0');
  const std::string sketch = "\x32" + len(positions.size()) + positions;
  const std::string slice = "\x32" + len(sketch.size()) + sketch;
  const std::string prefix = testing::CraftedPrefix();
  testing::WriteBytes(path_, prefix + ZstdFrame(format::FrameType::kBucketRecord, slice));
  EXPECT_EQ("LimitExceeded: " + At(prefix.size()) +
                "BucketRecord payload would decode 503316480 bytes of repeated numbers (limit 134217728)",
            Verify());
}

// Issue 12, through the index: 33554432 empty entries (field 1) in an index
// frame that is otherwise valid. Scanning does not parse index frames, so
// --verify called the file valid; it now reports the index frame.
TEST_F(Issue12Test, IndexOfEmptyEntries) {
  testing::WriteSmallTrace(path_, 1);
  std::string bytes = testing::ReadBytes(path_);
  const uint64_t index_offset = frame_io::GetU64(reinterpret_cast<const uint8_t*>(bytes.data()) + bytes.size() - 16);
  std::string footer = bytes.substr(bytes.size() - 16);
  bytes = bytes.substr(0, index_offset) +
          ZstdFrame(format::FrameType::kIndex, Fill("", std::string("\x0a\x00", 2), kRaw)) + footer;
  testing::WriteBytes(path_, bytes);
  EXPECT_EQ(
      "LimitExceeded: " + At(index_offset) + "Index payload would create 33554432 protobuf objects (limit 1114112)",
      Verify());
  // Plain reading ignores the index and scans: every data frame is returned.
  testing::ReadResult r = testing::ReadAll(path_);
  EXPECT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(3u, r.messages.size());
}

}  // namespace
}  // namespace gradtrace
