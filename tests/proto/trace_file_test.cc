// Writing and reading whole trace files: round trips, the index, the scanning
// fallback, chunked records, and writer-side errors.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "chunking.h"
#include "test_util.h"

namespace gradtrace {
namespace {

using testing::ReadAll;
using testing::TempDir;

TEST(TraceFile, RoundTripWithIndex) {
  TempDir dir;
  const std::string path = dir.File("rank-00001.gtrace");
  const std::vector<std::string> written = testing::WriteSmallTrace(path, 3);
  auto r = TraceReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE((*r)->has_index());
  EXPECT_EQ(static_cast<int>(written.size()), (*r)->index().entries_size());
  pb::RunInfo want = testing::SmallRun();
  want.set_model_fingerprint(ModelFingerprint(want));  // filled in by the writer
  EXPECT_EQ(want.SerializeAsString(), (*r)->run_info().SerializeAsString());
  Frame f;
  std::vector<std::string> got;
  while ((*r)->Next(&f)) got.push_back(f.step ? f.step->SerializeAsString() : f.bucket->SerializeAsString());
  EXPECT_TRUE((*r)->status().ok()) << (*r)->status().message();
  EXPECT_EQ(written, got);
  EXPECT_TRUE(VerifyFile(path).ok());
}

TEST(TraceFile, IndexGivesRandomAccess) {
  TempDir dir;
  const std::string path = dir.File("t.gtrace");
  const std::vector<std::string> written = testing::WriteSmallTrace(path, 3);
  auto r = TraceReader::Open(path);
  ASSERT_TRUE(r.ok());
  const pb::Index& index = (*r)->index();
  // Read backwards through the index.
  for (int i = index.entries_size() - 1; i >= 0; --i) {
    Frame f;
    ASSERT_TRUE((*r)->ReadAt(index.entries(i).offset(), &f).ok());
    EXPECT_EQ(written[i], f.step ? f.step->SerializeAsString() : f.bucket->SerializeAsString());
    if (f.bucket) {
      EXPECT_EQ(index.entries(i).step(), f.bucket->step());
      EXPECT_EQ(index.entries(i).bucket_id(), f.bucket->bucket_id());
      EXPECT_EQ(index.entries(i).phase(), f.bucket->phase());
    }
  }
  Frame f;
  EXPECT_EQ(Status::Code::kInvalidArgument, (*r)->ReadAt(3, &f).code());
  EXPECT_EQ(Status::Code::kInvalidArgument, (*r)->ReadAt((*r)->file_size(), &f).code());
}

TEST(TraceFile, ScanningAnIndexedFileGivesTheSameFrames) {
  TempDir dir;
  const std::string path = dir.File("t.gtrace");
  const std::vector<std::string> written = testing::WriteSmallTrace(path, 2);
  testing::ReadResult scanned = ReadAll(path, ReadOptions{.use_index = false, .table = nullptr});
  EXPECT_TRUE(scanned.status.ok()) << scanned.status.message();
  EXPECT_EQ(written, scanned.messages);
}

TEST(TraceFile, IndexlessFileIsScanned) {
  TempDir dir;
  const std::string path = dir.File("t.gtrace");
  const std::vector<std::string> written = testing::WriteSmallTrace(path, 2, WriterOptions{.write_index = false});
  auto r = TraceReader::Open(path);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE((*r)->has_index());
  testing::ReadResult res = ReadAll(path);
  EXPECT_TRUE(res.status.ok()) << res.status.message();
  EXPECT_EQ(written, res.messages);
  EXPECT_TRUE(VerifyFile(path).ok());
}

TEST(TraceFile, EmptyTraceHasAnEmptyIndex) {
  TempDir dir;
  const std::string path = dir.File("t.gtrace");
  auto w = TraceWriter::Open(path, testing::SmallRun());
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Close().ok());
  ASSERT_TRUE((*w)->Close().ok());  // idempotent
  testing::ReadResult res = ReadAll(path);
  EXPECT_TRUE(res.status.ok()) << res.status.message();
  EXPECT_TRUE(res.messages.empty());
  auto r = TraceReader::Open(path);
  EXPECT_TRUE((*r)->has_index());
}

TEST(TraceFile, WriterRefusesInvalidInput) {
  TempDir dir;
  pb::RunInfo run = testing::SmallRun();
  run.mutable_params(1)->set_id(5);
  auto bad = TraceWriter::Open(dir.File("a.gtrace"), run);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(Status::Code::kInvalidArgument, bad.status().code());

  auto w = TraceWriter::Open(dir.File("b.gtrace"), testing::SmallRun());
  ASSERT_TRUE(w.ok());
  pb::BucketRecord rec = testing::Bucket(testing::SmallRun(), 0, 0, pb::FINAL);
  rec.mutable_slices(0)->set_param_id(9);
  Status s = (*w)->WriteBucket(rec);
  EXPECT_EQ(Status::Code::kInvalidArgument, s.code());
  EXPECT_NE(std::string::npos, s.message().find("unknown param id")) << s.message();
  rec.mutable_slices(0)->set_param_id(0);
  rec.mutable_slices(0)->set_count(129);  // param 0 has 128 elements
  EXPECT_EQ(Status::Code::kInvalidArgument, (*w)->WriteBucket(rec).code());
  EXPECT_TRUE((*w)->Close().ok());
  EXPECT_EQ(Status::Code::kInvalidArgument, (*w)->WriteStep(testing::Step(0)).code());  // after Close
}

TEST(TraceFile, UnwritableDirectoryIsAnIoErrorNamingThePath) {
  auto w = TraceWriter::Open("/nonexistent-gradtrace-dir/rank-00000.gtrace", testing::SmallRun());
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(Status::Code::kIoError, w.status().code());
  EXPECT_EQ("/nonexistent-gradtrace-dir/rank-00000.gtrace: cannot create: No such file or directory",
            w.status().message());
}

// Issue 20: two runs writing into one directory both exited 0 and left files that read as "checksum mismatch at
// offset 69254", nothing pointing at the cause. Now the second writer fails at Open, naming the file and the run
// in it, and a finished trace is replaced only on purpose (WriterOptions.overwrite).
TEST(TraceFile, SecondWriterOfAFileFailsAtOpenNamingIt) {
  TempDir dir;
  const std::string path = dir.File("rank-00001.gtrace");
  pb::RunInfo second = testing::SmallRun();
  second.set_run_id("run-2");
  auto first = TraceWriter::Open(path, testing::SmallRun());
  ASSERT_TRUE(first.ok()) << first.status().message();
  ASSERT_TRUE((*first)->WriteStep(testing::Step(0)).ok());

  auto w = TraceWriter::Open(path, second);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(Status::Code::kIoError, w.status().code());
  EXPECT_EQ(path + ": exists: another run is writing here now (run 'run-1' of gradtrace-test on localhost)",
            w.status().message());
  WriterOptions overwrite;
  overwrite.overwrite = true;  // not even on purpose while its writer holds it
  w = TraceWriter::Open(path, second, overwrite);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(path + ": exists: another run is writing here now (run 'run-1' of gradtrace-test on localhost)",
            w.status().message());

  ASSERT_TRUE((*first)->Close().ok());
  w = TraceWriter::Open(path, second);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(path +
                ": exists (run 'run-1' of gradtrace-test on localhost): not replaced without overwrite "
                "(gradtrace-train --overwrite, overwrite=True in Python); or write to a new directory",
            w.status().message());
  // The first run's trace is intact.
  testing::ReadResult res = ReadAll(path);
  EXPECT_TRUE(res.status.ok()) << res.status.message();
  EXPECT_EQ(res.messages.size(), 1u);

  w = TraceWriter::Open(path, second, overwrite);
  ASSERT_TRUE(w.ok()) << w.status().message();
  ASSERT_TRUE((*w)->Close().ok());
  auto r = TraceReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ((*r)->run_info().run_id(), "run-2");
  EXPECT_TRUE(ReadAll(path).messages.empty());
}

TEST(TraceFile, WriterRefusesAnExistingFileThatIsNoTrace) {
  TempDir dir;
  testing::WriteBytes(dir.File("notes.txt"), "not a trace");
  auto w = TraceWriter::Open(dir.File("notes.txt"), testing::SmallRun());
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(dir.File("notes.txt") +
                ": exists: not replaced without overwrite (gradtrace-train --overwrite, overwrite=True in Python); "
                "or write to a new directory",
            w.status().message());
  EXPECT_EQ(testing::ReadBytes(dir.File("notes.txt")), "not a trace");
  // A FIFO is not opened at all: opening it for writing would block until a reader came.
  const std::string fifo = dir.File("rank-00002.gtrace");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ::alarm(20);  // a regression fails (SIGALRM) instead of hanging
  w = TraceWriter::Open(fifo, testing::SmallRun());
  ::alarm(0);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(fifo + ": exists and is not a regular file", w.status().message());
}

// Issue 20: a FIFO named like a trace blocked the reader in open() until some process opened it for writing.
TEST(TraceFile, ReaderRefusesAFifoWithoutBlocking) {
  TempDir dir;
  const std::string fifo = dir.File("rank-00001.gtrace");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ::alarm(20);  // a regression fails (SIGALRM) instead of hanging
  testing::ReadResult res = ReadAll(fifo);
  ::alarm(0);
  EXPECT_FALSE(res.opened);
  EXPECT_EQ(Status::Code::kIoError, res.status.code());
  EXPECT_EQ(fifo + ": not a regular file (a FIFO)", res.status.message());
}

TEST(TraceFile, DiskFullIsAnIoErrorAndSticky) {
  if (std::FILE* f = std::fopen("/dev/full", "wb")) {
    std::fclose(f);
  } else {
    GTEST_SKIP() << "no /dev/full";
  }
  auto w = TraceWriter::Open("/dev/full", testing::SmallRun());
  ASSERT_FALSE(w.ok());  // the header and RunInfo flush fails
  EXPECT_EQ(Status::Code::kIoError, w.status().code());
  EXPECT_NE(std::string::npos, w.status().message().find("/dev/full: offset 16: flush failed: No space left on device"))
      << w.status().message();
}

TEST(TraceFile, MissingFileIsAnIoError) {
  testing::ReadResult res = ReadAll("/nonexistent-gradtrace.gtrace");
  EXPECT_FALSE(res.opened);
  EXPECT_EQ("/nonexistent-gradtrace.gtrace: cannot open: No such file or directory", res.status.message());
  TempDir dir;
  auto r = TraceReader::Open(dir.File(""));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string::npos, r.status().message().find("not a regular file"));
}

TEST(TraceFile, EveryModeAndDTypeThroughAFile) {
  TempDir dir;
  const std::string path = dir.File("t.gtrace");
  pb::RunInfo run;
  const pb::DType dtypes[] = {pb::FP32, pb::FP16, pb::BF16, pb::FP64};
  for (int i = 0; i < 4; ++i) *run.add_params() = testing::Param(i, "p" + std::to_string(i), {333}, dtypes[i]);
  auto w = TraceWriter::Open(path, run);
  ASSERT_TRUE(w.ok());
  std::vector<std::string> written;
  const CaptureMode modes[] = {
      {CaptureMode::Kind::kFull, 0}, {CaptureMode::Kind::kSketch, 50}, {CaptureMode::Kind::kStats, 0}};
  std::vector<std::string> raw(4);
  for (int i = 0; i < 4; ++i) {
    const size_t width = DTypeSize(dtypes[i]);
    raw[i].resize(333 * width);
    for (size_t b = 0; b < raw[i].size(); ++b) raw[i][b] = static_cast<char>((b * 131 + i) % 251);
  }
  for (int m = 0; m < 3; ++m) {
    pb::BucketRecord rec;
    rec.set_bucket_id(m);
    for (int i = 0; i < 4; ++i)
      *rec.add_slices() = MakeSlice(run.params(i), 0, 333, dtypes[i], raw[i].data(), modes[m]);
    ASSERT_TRUE((*w)->WriteBucket(rec).ok());
    written.push_back(rec.SerializeAsString());
  }
  ASSERT_TRUE((*w)->Close().ok());
  testing::ReadResult res = ReadAll(path);
  ASSERT_TRUE(res.status.ok()) << res.status.message();
  EXPECT_EQ(written, res.messages);
  pb::BucketRecord full;
  ASSERT_TRUE(full.ParseFromString(res.messages[0]));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(raw[i], *DecodeFullBytes(full.slices(i))) << DTypeName(dtypes[i]);
}

// One record larger than kChunkTarget (~8 MB of fp32): written as several
// frames, none above kMaxFramePayload, joined back byte for byte.
TEST(TraceFile, LargeRecordIsChunkedAndReassembled) {
  TempDir dir;
  const std::string path = dir.File("t.gtrace");
  const int64_t n = (format::kChunkTarget / 4) + 1000000;
  pb::RunInfo run;
  *run.add_params() = testing::Param(0, "big", {n});
  *run.add_params() = testing::Param(1, "small", {10});
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 4093) * 1e-4f;
  pb::BucketRecord rec;
  rec.set_step(1);
  rec.set_phase(pb::FINAL);
  *rec.add_slices() = MakeSlice(run.params(1), 0, 10, pb::FP32, v.data(), CaptureMode{});
  *rec.add_slices() = MakeSlice(run.params(0), 0, n, pb::FP32, v.data(), CaptureMode{});
  {
    auto w = TraceWriter::Open(path, run);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->WriteBucket(rec).ok());
    ASSERT_TRUE((*w)->Close().ok());
  }
  auto r = TraceReader::Open(path);
  ASSERT_TRUE(r.ok());
  std::vector<pb::BucketRecord> chunks;
  Frame f;
  while ((*r)->Next(&f)) {
    EXPECT_LE(f.raw_len, format::kChunkTarget);
    EXPECT_LE(f.stored_len, format::kMaxFramePayload);
    chunks.push_back(std::move(*f.bucket));
  }
  ASSERT_TRUE((*r)->status().ok()) << (*r)->status().message();
  ASSERT_EQ(2u, chunks.size());
  EXPECT_EQ(2, chunks[0].chunk_count());
  auto merged = MergeChunks(std::move(chunks));
  ASSERT_TRUE(merged.ok()) << merged.status().message();
  EXPECT_EQ(rec.SerializeAsString(), merged->SerializeAsString());
}

// Compression ratio (raw / stored) of one full fp32 slice, with or without
// the byte-shuffle.
double CompressionRatio(const std::string& path, const std::vector<float>& v, bool shuffled) {
  const int64_t n = static_cast<int64_t>(v.size());
  pb::RunInfo run;
  *run.add_params() = testing::Param(0, "w", {n});
  pb::BucketRecord rec;
  *rec.add_slices() = MakeSlice(run.params(0), 0, n, pb::FP32, v.data(), CaptureMode{});
  if (!shuffled) {
    rec.mutable_slices(0)->mutable_full()->set_data(std::string(reinterpret_cast<const char*>(v.data()), n * 4));
    rec.mutable_slices(0)->mutable_full()->set_shuffled(false);
  }
  auto w = TraceWriter::Open(path, run);
  EXPECT_TRUE(w.ok() && (*w)->WriteBucket(rec).ok() && (*w)->Close().ok());
  auto r = TraceReader::Open(path);
  Frame f;
  EXPECT_TRUE(r.ok() && (*r)->Next(&f));
  return static_cast<double>(f.raw_len) / f.stored_len;
}

// Measures what byte-shuffle buys on gradient-like fp32 values: N(0, 1e-3)
// with full mantissas (the worst case: the mantissa bytes are noise), and the
// same values rounded to bf16 precision, as mixed-precision training produces.
TEST(TraceFile, ByteShuffleImprovesCompressionOfGradients) {
  TempDir dir;
  std::vector<float> v = testing::Floats(1 << 20, 7);
  const double plain = CompressionRatio(dir.File("a"), v, false);
  const double shuffled = CompressionRatio(dir.File("b"), v, true);
  for (float& x : v) {
    uint8_t b[2];
    DoubleToElement(pb::BF16, x, b);
    x = static_cast<float>(ElementToDouble(pb::BF16, b));
  }
  const double plain_bf16 = CompressionRatio(dir.File("c"), v, false);
  const double shuffled_bf16 = CompressionRatio(dir.File("d"), v, true);
  std::printf(
      "zstd level 3 on 2^20 fp32 N(0, 1e-3): ratio %.3f plain, %.3f byte-shuffled; "
      "bf16-rounded: %.3f plain, %.3f byte-shuffled\n",
      plain, shuffled, plain_bf16, shuffled_bf16);
  EXPECT_GT(shuffled, plain * 1.05);
  EXPECT_GT(shuffled_bf16, plain_bf16 * 1.2);
}

}  // namespace
}  // namespace gradtrace
