// Truncation and corruption of trace files, one test per failure path, in the
// manner of LevelDB's db/log_test.cc: write a real file, damage its bytes
// (bump a byte, fix or break the checksum, shrink the file), then assert what
// was recovered and the exact message.
#include <gtest/gtest.h>
#include <zstd.h>

#include <chrono>
#include <random>

#include "test_util.h"

namespace gradtrace {
namespace {

// The writer's minor version, as the reader prints it.
const std::string kMinor = std::to_string(format::kMinorVersion);

using testing::ReadResult;

class TraceLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.File("rank-00000.gtrace");
    // The damage tests need zstd-compressed bucket frames: these small ones
    // compress at level 3, not at the writer's default level 1.
    WriterOptions options;
    options.zstd_level = 3;
    written_ = testing::WriteSmallTrace(path_, 2, options);  // step, bucket, bucket, step, bucket, bucket
    bytes_ = testing::ReadBytes(path_);
    ends_ = testing::FrameEnds(bytes_);
    ASSERT_EQ(8u, ends_.size());  // RunInfo, 6 data frames, index
  }

  // Frame 0 is RunInfo, 1..6 the data frames, 7 the index.
  uint64_t FrameOffset(size_t i) const { return i == 0 ? format::kFileHeaderSize : ends_[i - 1]; }
  uint64_t IndexEnd() const { return ends_.back(); }

  void Commit() { testing::WriteBytes(path_, bytes_); }
  void IncrementByte(uint64_t offset, int delta) {
    bytes_[offset] = static_cast<char>(bytes_[offset] + delta);
    Commit();
  }
  void SetByte(uint64_t offset, uint8_t v) {
    bytes_[offset] = static_cast<char>(v);
    Commit();
  }
  void SetU32(uint64_t offset, uint32_t v) {
    frame_io::PutU32(reinterpret_cast<uint8_t*>(bytes_.data()) + offset, v);
    Commit();
  }
  void ShrinkTo(uint64_t size) {
    bytes_.resize(size);
    Commit();
  }
  // Recomputes the checksum of the frame at `offset` over its current bytes.
  void FixChecksum(uint64_t offset) {
    auto* p = reinterpret_cast<uint8_t*>(bytes_.data()) + offset;
    const uint32_t stored = frame_io::GetU32(p);
    uint32_t crc = crc32c::Value(p + 12, 4);
    crc = crc32c::Extend(crc, p + format::kFrameHeaderSize, stored);
    frame_io::PutU32(p + 8, crc32c::Mask(crc));
    Commit();
  }
  uint8_t Codec(size_t frame) const { return static_cast<uint8_t>(bytes_[FrameOffset(frame) + 13]); }

  ReadResult Read(ReadOptions options = {}) { return testing::ReadAll(path_, options); }
  std::string At(uint64_t offset) const { return path_ + ": offset " + std::to_string(offset) + ": "; }
  std::vector<std::string> FirstWritten(size_t n) const { return {written_.begin(), written_.begin() + n}; }

  testing::TempDir dir_;
  std::string path_;
  std::vector<std::string> written_;
  std::string bytes_;
  std::vector<uint64_t> ends_;
};

bool StartsWith(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

TEST_F(TraceLogTest, ReadsBackEverything) {
  ReadResult r = Read();
  EXPECT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(written_, r.messages);
  EXPECT_EQ(FrameOffset(7), r.stop_offset);  // stops at the index
}

// --- the file header ---------------------------------------------------------

TEST_F(TraceLogTest, EmptyFile) {
  ShrinkTo(0);
  ReadResult r = Read();
  EXPECT_FALSE(r.opened);
  EXPECT_EQ(Status::Code::kTruncated, r.status.code());
  EXPECT_EQ(At(0) + "empty file", r.status.message());
}

TEST_F(TraceLogTest, TruncatedFileHeader) {
  ShrinkTo(10);
  ReadResult r = Read();
  EXPECT_EQ(Status::Code::kTruncated, r.status.code());
  EXPECT_EQ(At(0) + "truncated file header: 10 of 16 bytes", r.status.message());
}

TEST_F(TraceLogTest, BadMagic) {
  IncrementByte(3, 1);
  ReadResult r = Read();
  EXPECT_EQ(Status::Code::kCorruption, r.status.code());
  EXPECT_EQ(At(0) + "bad magic: not a gradtrace file", r.status.message());
}

TEST_F(TraceLogTest, NewerMajorVersionIsRefused) {
  SetByte(8, 2);
  ReadResult r = Read();
  EXPECT_FALSE(r.opened);
  EXPECT_EQ(At(8) + "format version 2." + kMinor + " is newer than this reader's 1." + kMinor +
                ": read it with a newer gradtrace",
            r.status.message());
}

TEST_F(TraceLogTest, OlderMajorVersionIsRefused) {
  SetByte(8, 0);
  ReadResult r = Read();
  EXPECT_EQ(At(8) + "format version 0." + kMinor + " is not supported (this reader reads 1.x)", r.status.message());
}

TEST_F(TraceLogTest, NewerMinorVersionIsReadWithItsNewFlags) {
  SetByte(10, format::kMinorVersion + 2);  // a newer minor
  SetByte(12, 0x81);                       // a flag that minor may define
  ReadResult r = Read();
  EXPECT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(written_, r.messages);
}

TEST_F(TraceLogTest, UnknownFlagsInACurrentVersionFile) {
  SetByte(12, 0x05);
  ReadResult r = Read();
  EXPECT_EQ(Status::Code::kCorruption, r.status.code());
  EXPECT_EQ(At(12) + "unknown header flags 0x00000005 in a version 1." + kMinor + " file", r.status.message());
}

// --- frame headers -------------------------------------------------------------

TEST_F(TraceLogTest, FirstFrameIsNotRunInfo) {
  SetByte(FrameOffset(0) + 12, 2);
  FixChecksum(FrameOffset(0));
  ReadResult r = Read();
  EXPECT_EQ(Status::Code::kCorruption, r.status.code());
  EXPECT_EQ(At(16) + "first frame has type 2, expected RunInfo (1)", r.status.message());
}

TEST_F(TraceLogTest, ChecksumMismatch) {
  IncrementByte(FrameOffset(2) + 20, 1);
  ReadResult r = Read();
  EXPECT_EQ(Status::Code::kCorruption, r.status.code());
  EXPECT_EQ(FirstWritten(1), r.messages);
  EXPECT_TRUE(StartsWith(r.status.message(), At(FrameOffset(2)) + "checksum mismatch (stored 0x"))
      << r.status.message();
  EXPECT_EQ(FrameOffset(2), r.stop_offset);
}

TEST_F(TraceLogTest, ChecksumCoversTheTypeByte) {
  SetByte(FrameOffset(1) + 12, 3);  // StepInfo relabelled BucketRecord
  ReadResult r = Read();
  EXPECT_TRUE(r.messages.empty());
  EXPECT_TRUE(StartsWith(r.status.message(), At(FrameOffset(1)) + "checksum mismatch")) << r.status.message();
}

TEST_F(TraceLogTest, UnknownFrameType) {
  SetByte(FrameOffset(3) + 12, 9);
  FixChecksum(FrameOffset(3));
  ReadResult r = Read();
  EXPECT_EQ(Status::Code::kCorruption, r.status.code());
  EXPECT_EQ(FirstWritten(2), r.messages);
  EXPECT_EQ(At(FrameOffset(3)) + "unknown frame type 9", r.status.message());
}

TEST_F(TraceLogTest, FrameTypeZero) {
  SetByte(FrameOffset(1) + 12, 0);
  FixChecksum(FrameOffset(1));
  EXPECT_EQ(At(FrameOffset(1)) + "unknown frame type 0", Read().status.message());
}

TEST_F(TraceLogTest, UnknownFrameTypeOfANewerMinorVersionIsSkipped) {
  SetByte(10, format::kMinorVersion + 1);
  SetByte(FrameOffset(3) + 12, 9);
  FixChecksum(FrameOffset(3));
  ReadResult r = Read();
  EXPECT_TRUE(r.status.ok()) << r.status.message();
  std::vector<std::string> want = written_;
  want.erase(want.begin() + 2);
  EXPECT_EQ(want, r.messages);
  EXPECT_EQ(written_.size(), r.offsets.size());  // returned, with neither message set
}

TEST_F(TraceLogTest, UnknownCodec) {
  SetByte(FrameOffset(2) + 13, 7);
  FixChecksum(FrameOffset(2));
  ReadResult r = Read();
  EXPECT_EQ(FirstWritten(1), r.messages);
  EXPECT_EQ(At(FrameOffset(2)) + "unknown codec 7", r.status.message());
}

TEST_F(TraceLogTest, ReservedBitsSet) {
  SetByte(FrameOffset(2) + 15, 0x40);
  FixChecksum(FrameOffset(2));
  EXPECT_EQ(At(FrameOffset(2)) + "reserved frame header bits set (16384)", Read().status.message());
}

TEST_F(TraceLogTest, RawLenDisagreesWithZstdContentSize) {
  ASSERT_EQ(1, Codec(2));  // bucket frames compress
  const uint32_t raw = frame_io::GetU32(reinterpret_cast<const uint8_t*>(bytes_.data()) + FrameOffset(2) + 4);
  SetU32(FrameOffset(2) + 4, raw + 1);  // raw_len is checked after decompression, not by the CRC
  ReadResult r = Read();
  EXPECT_EQ(FirstWritten(1), r.messages);
  EXPECT_EQ(At(FrameOffset(2)) + "zstd frame content size does not match raw_len " + std::to_string(raw + 1),
            r.status.message());
}

TEST_F(TraceLogTest, RawLenDisagreesWithStoredLenOfUncompressedFrame) {
  ASSERT_EQ(0, Codec(1));  // a StepInfo is too small to compress
  const uint32_t stored = frame_io::GetU32(reinterpret_cast<const uint8_t*>(bytes_.data()) + FrameOffset(1));
  SetU32(FrameOffset(1) + 4, stored + 2);
  EXPECT_EQ(At(FrameOffset(1)) + "raw_len " + std::to_string(stored + 2) + " != stored_len " + std::to_string(stored) +
                " for an uncompressed frame",
            Read().status.message());
}

// --- declared sizes beyond the limits ---------------------------------------------

TEST_F(TraceLogTest, HugeStoredLenIsRefusedBeforeAllocating) {
  SetU32(FrameOffset(2), 0xfffffff0u);
  const auto start = std::chrono::steady_clock::now();
  ReadResult r = Read();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
  EXPECT_EQ(Status::Code::kLimitExceeded, r.status.code());
  EXPECT_EQ(FirstWritten(1), r.messages);
  EXPECT_EQ(At(FrameOffset(2)) + "declared stored_len 4294967280 exceeds the limit of 67108864", r.status.message());
}

TEST_F(TraceLogTest, HugeRawLenIsRefusedBeforeAllocating) {
  SetU32(FrameOffset(2) + 4, format::kMaxFramePayload + 1);
  ReadResult r = Read();
  EXPECT_EQ(Status::Code::kLimitExceeded, r.status.code());
  EXPECT_EQ(At(FrameOffset(2)) + "declared raw_len 67108865 exceeds the limit of 67108864", r.status.message());
}

TEST_F(TraceLogTest, HugeRunInfoIsRefusedAtOpen) {
  SetU32(FrameOffset(0) + 4, 0x80000000u);
  ReadResult r = Read();
  EXPECT_FALSE(r.opened);
  EXPECT_EQ(Status::Code::kLimitExceeded, r.status.code());
  EXPECT_EQ(At(16) + "declared raw_len 2147483648 exceeds the limit of 67108864", r.status.message());
}

TEST_F(TraceLogTest, StoredLenRunningIntoTheIndexIsCorruption) {
  const uint32_t stored = frame_io::GetU32(reinterpret_cast<const uint8_t*>(bytes_.data()) + FrameOffset(6));
  SetU32(FrameOffset(6), stored + 40);
  ReadResult r = Read();
  EXPECT_EQ(Status::Code::kCorruption, r.status.code());
  EXPECT_EQ(FirstWritten(5), r.messages);
  EXPECT_EQ(At(FrameOffset(6)) + "frame payload: " + std::to_string(stored) + " of " + std::to_string(stored + 40) +
                " bytes before the index at offset " + std::to_string(FrameOffset(7)),
            r.status.message());
}

TEST_F(TraceLogTest, TooManyParamsIsRefused) {
  pb::RunInfo run;
  run.mutable_params()->Reserve(format::kMaxParams + 1);
  for (int64_t i = 0; i <= format::kMaxParams; ++i) run.add_params();
  testing::WriteBytes(
      path_, testing::FileHeader() + testing::PlainFrame(format::FrameType::kRunInfo, run.SerializeAsString()));
  ReadResult r = Read();
  EXPECT_EQ(Status::Code::kLimitExceeded, r.status.code());
  EXPECT_EQ(At(16) + "RunInfo lists 1048577 params (limit 1048576)", r.status.message());
}

// Fuzz finding (fuzz_run_info, crash-a595827d): a parameter name holding a
// newline split the error message over two lines. Names are now escaped.
TEST_F(TraceLogTest, FuzzParamNameWithANewlineStaysOnOneLine) {
  pb::RunInfo run = testing::SmallRun();
  run.mutable_params(0)->set_name("\nkale");
  run.mutable_params(0)->set_id(4);
  testing::WriteBytes(
      path_, testing::FileHeader() + testing::PlainFrame(format::FrameType::kRunInfo, run.SerializeAsString()));
  ReadResult r = Read();
  EXPECT_EQ(Status::Code::kCorruption, r.status.code());
  EXPECT_EQ(At(16) + "param 0 '\\x0akale': id 4, expected 0", r.status.message());
}

// The same finding: a name of any length stays a short line (96 bytes, cut
// between UTF-8 characters, never inside one).
TEST_F(TraceLogTest, FuzzLongParamNameIsCutInTheMessage) {
  pb::RunInfo run = testing::SmallRun();
  std::string name = "x";
  for (int i = 0; i < 100; ++i) name += "\xc3\xa9";  // 'é', 2 bytes each
  run.mutable_params(1)->set_name(name);
  run.mutable_params(1)->set_dtype(pb::DTYPE_UNSPECIFIED);
  testing::WriteBytes(
      path_, testing::FileHeader() + testing::PlainFrame(format::FrameType::kRunInfo, run.SerializeAsString()));
  std::string shown = "x";
  for (int i = 0; i < 47; ++i) shown += "\xc3\xa9";  // 95 bytes: byte 96 would split a character
  EXPECT_EQ(At(16) + "param 1 '" + shown + "'...: unknown dtype 0", Read().status.message());
}

// Issue 20: ranks index a trace set's per-rank tables, yet a negative rank was written and read, and a group
// listing 1M ranks in a world of 2 was accepted. The reader refuses each, naming the file and offset.
TEST_F(TraceLogTest, NegativeRanksAndGroupMembersOutsideTheWorldAreRefused) {
  auto read_with = [&](void (*edit)(pb::RunInfo*)) {
    pb::RunInfo run = testing::SmallRun();  // world 4, rank 1, group sp = {0, 1}
    edit(&run);
    testing::WriteBytes(
        path_, testing::FileHeader() + testing::PlainFrame(format::FrameType::kRunInfo, run.SerializeAsString()));
    ReadResult r = Read();
    EXPECT_EQ(Status::Code::kCorruption, r.status.code());
    return r.status.message();
  };
  EXPECT_EQ(At(16) + "rank -1 is negative", read_with([](pb::RunInfo* r) { r->set_rank(-1); }));
  EXPECT_EQ(At(16) + "rank 4 outside world 4", read_with([](pb::RunInfo* r) { r->set_rank(4); }));
  EXPECT_EQ(At(16) + "negative sp_rank -2", read_with([](pb::RunInfo* r) { r->set_sp_rank(-2); }));
  EXPECT_EQ(At(16) + "negative ep_rank -1", read_with([](pb::RunInfo* r) { r->set_ep_rank(-1); }));
  EXPECT_EQ(At(16) + "group 'sp': rank -1 is negative",
            read_with([](pb::RunInfo* r) { r->mutable_groups(0)->add_ranks(-1); }));
  EXPECT_EQ(At(16) + "group 'sp': rank 4 outside world 4", read_with([](pb::RunInfo* r) {
              for (int i = 2; i < 1'000'000; ++i) r->mutable_groups(0)->add_ranks(i);  // 1M ranks in a world of 4
            }));
  EXPECT_EQ(At(16) + "group 'sp': rank 0 listed twice", read_with([](pb::RunInfo* r) {
              for (int i = 2; i < 1'000'000; ++i) r->mutable_groups(0)->add_ranks(i % 2);
            }));
  // World unrecorded (0): only the set knows the bound (diff/load/trace_set.cc); the sign is still checked.
  EXPECT_EQ(At(16) + "group 'sp': rank -3 is negative", read_with([](pb::RunInfo* r) {
              r->mutable_config()->set_world(0);
              r->mutable_groups(0)->add_ranks(-3);
            }));
}

// Format 1.5's pipeline fields from a stranger's file: a parameter's stages lie inside the pipeline
// (at most two: a tied parameter's copies), and the pipeline's counts are not negative.
TEST_F(TraceLogTest, PipelineStagesOutsideThePipelineAreRefused) {
  auto read_with = [&](void (*edit)(pb::RunInfo*)) {
    pb::RunInfo run = testing::SmallRun();
    run.mutable_config()->set_pp_stages(2);
    edit(&run);
    testing::WriteBytes(
        path_, testing::FileHeader() + testing::PlainFrame(format::FrameType::kRunInfo, run.SerializeAsString()));
    ReadResult r = Read();
    EXPECT_EQ(Status::Code::kCorruption, r.status.code()) << r.status.message();
    return r.status.message();
  };
  auto has = [](const std::string& message, const std::string& part) {
    return message.find(part) != std::string::npos ? ::testing::AssertionSuccess()
                                                   : ::testing::AssertionFailure() << message;
  };
  EXPECT_TRUE(has(read_with([](pb::RunInfo* r) { r->mutable_params(0)->add_stages(2); }),
                  "stage 2 outside the pipeline's 2 stages"));
  EXPECT_TRUE(has(read_with([](pb::RunInfo* r) { r->mutable_params(0)->add_stages(-1); }),
                  "stage -1 outside the pipeline's 2 stages"));
  EXPECT_TRUE(has(read_with([](pb::RunInfo* r) {
                    for (int i = 0; i < 1'000'000; ++i) r->mutable_params(0)->add_stages(0);
                  }),
                  "held by 1000000 stages, at most 2"));
  EXPECT_TRUE(has(read_with([](pb::RunInfo* r) { r->mutable_config()->set_pp_microbatches(-4); }),
                  "negative pp_microbatches -4"));
  // A tied parameter's two stages, and stages when pp_stages is not recorded, are read.
  pb::RunInfo run = testing::SmallRun();
  run.mutable_params(0)->add_stages(0);
  run.mutable_params(0)->add_stages(7);
  testing::WriteBytes(
      path_, testing::FileHeader() + testing::PlainFrame(format::FrameType::kRunInfo, run.SerializeAsString()));
  EXPECT_NE(Status::Code::kCorruption, Read().status.code());
}

// The writer runs the same check before creating the file: it never writes what the reader refuses.
TEST_F(TraceLogTest, WriterRefusesRanksOutsideTheWorld) {
  const std::string path = dir_.File("rank-00001.gtrace");
  pb::RunInfo run = testing::SmallRun();
  run.mutable_groups(0)->add_ranks(7);
  auto w = TraceWriter::Open(path, run);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(path + ": invalid RunInfo: group 'sp': rank 7 outside world 4", w.status().message());
  EXPECT_FALSE(std::filesystem::exists(path));
  run = testing::SmallRun();
  run.set_rank(-1);
  EXPECT_EQ(path + ": invalid RunInfo: rank -1 is negative", TraceWriter::Open(path, run).status().message());
}

// GitHub-style regression for a decompression bomb: a few hundred stored bytes
// that inflate to 32 MiB, in a frame whose header claims 100 bytes. Must be
// refused from the zstd frame header, with only raw_len bytes ever allocated.
TEST_F(TraceLogTest, DecompressionBombIsRefused) {
  const std::string zeros(32u << 20, '\0');
  std::string bomb(ZSTD_compressBound(zeros.size()), '\0');
  bomb.resize(ZSTD_compress(bomb.data(), bomb.size(), zeros.data(), zeros.size(), 19));
  ASSERT_LT(bomb.size(), 4096u);
  testing::WriteBytes(path_, testing::CraftedPrefix() + testing::EncodeFrame(3, 1, bomb, 100));
  ReadResult r = Read();
  EXPECT_EQ(Status::Code::kCorruption, r.status.code());
  EXPECT_TRUE(StartsWith(r.status.message(), path_ + ": offset ")) << r.status.message();
  EXPECT_NE(std::string::npos, r.status.message().find("zstd frame content size does not match raw_len 100"));
}

TEST_F(TraceLogTest, ZstdFrameWithoutContentSizeIsRefused) {
  // A streamed zstd frame carries no content size; ours always do.
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0);
  const std::string payload = testing::Step(1).SerializeAsString();
  std::string z(ZSTD_compressBound(payload.size()), '\0');
  z.resize(ZSTD_compress2(cctx, z.data(), z.size(), payload.data(), payload.size()));
  ZSTD_freeCCtx(cctx);
  const std::string prefix = testing::CraftedPrefix();
  testing::WriteBytes(path_, prefix + testing::EncodeFrame(2, 1, z, static_cast<uint32_t>(payload.size())));
  EXPECT_EQ(At(prefix.size()) + "zstd frame content size does not match raw_len " + std::to_string(payload.size()),
            Read().status.message());
}

TEST_F(TraceLogTest, TrailingBytesAfterTheZstdFrame) {
  const std::string payload = testing::Step(1).SerializeAsString();
  std::string z(ZSTD_compressBound(payload.size()), '\0');
  z.resize(ZSTD_compress(z.data(), z.size(), payload.data(), payload.size(), 3));
  const std::string prefix = testing::CraftedPrefix();
  testing::WriteBytes(path_, prefix + testing::EncodeFrame(2, 1, z + "junk", static_cast<uint32_t>(payload.size())));
  EXPECT_EQ(At(prefix.size()) + "payload is not exactly one zstd frame", Read().status.message());
}

// Issue 12: a zstd skippable frame decodes to zero bytes, so with raw_len 0
// it passed as an empty (valid) StepInfo. Every magic 0x184D2A50..5F is refused.
TEST_F(TraceLogTest, ZstdSkippableFrameIsNotAPayload) {
  const std::string prefix = testing::CraftedPrefix();
  for (uint8_t variant : {0x50, 0x5a, 0x5f}) {
    std::string skippable(
        "\x00\x2a\x4d\x18\x04\x00\x00\x00"
        "abcd",
        12);  // magic, size 4, user data
    skippable[0] = static_cast<char>(variant);
    ASSERT_EQ(0u, ZSTD_getFrameContentSize(skippable.data(), skippable.size()));
    ASSERT_EQ(skippable.size(), ZSTD_findFrameCompressedSize(skippable.data(), skippable.size()));
    testing::WriteBytes(path_, prefix + testing::EncodeFrame(2, 1, skippable, 0));
    ReadResult r = Read();
    EXPECT_EQ(Status::Code::kCorruption, r.status.code());
    EXPECT_EQ(At(prefix.size()) + "payload is a zstd skippable frame, not data", r.status.message());
    EXPECT_EQ(r.status.message(), VerifyFile(path_).message());
  }
}

// --- payloads ---------------------------------------------------------------------

TEST_F(TraceLogTest, UnparsableProtobuf) {
  const std::string prefix = testing::CraftedPrefix();
  testing::WriteBytes(path_, prefix + testing::PlainFrame(format::FrameType::kBucketRecord, "\xff\xff\xff"));
  ReadResult r = Read();
  EXPECT_EQ(Status::Code::kCorruption, r.status.code());
  EXPECT_EQ(At(prefix.size()) + "cannot parse BucketRecord payload (3 bytes)", r.status.message());
}

TEST_F(TraceLogTest, SliceOfUnknownParam) {
  pb::BucketRecord rec = testing::Bucket(testing::SmallRun(), 0, 0, pb::FINAL);
  rec.mutable_slices(0)->set_param_id(2);
  const std::string prefix = testing::CraftedPrefix();
  testing::WriteBytes(path_,
                      prefix + testing::PlainFrame(format::FrameType::kStepInfo, testing::Step(0).SerializeAsString()) +
                          testing::PlainFrame(format::FrameType::kBucketRecord, rec.SerializeAsString()));
  ReadResult r = Read();
  EXPECT_EQ(1u, r.messages.size());
  EXPECT_EQ(Status::Code::kCorruption, r.status.code());
  EXPECT_TRUE(
      StartsWith(r.status.message(), At(testing::ReadBytes(path_).size() - 16 - rec.ByteSizeLong()) +
                                         "slice 0 (param 2, elements [0, +128)): unknown param id (run has 2 params)"))
      << r.status.message();
}

TEST_F(TraceLogTest, FullPayloadOfTheWrongSize) {
  pb::BucketRecord rec = testing::Bucket(testing::SmallRun(), 0, 0, pb::FINAL);
  rec.mutable_slices(0)->mutable_full()->mutable_data()->pop_back();
  const std::string prefix = testing::CraftedPrefix();
  testing::WriteBytes(path_, prefix + testing::PlainFrame(format::FrameType::kBucketRecord, rec.SerializeAsString()));
  EXPECT_EQ(At(prefix.size()) + "slice 0 (param 0, elements [0, +128)): full payload holds 511 bytes, expected 128 x 4",
            Read().status.message());
}

TEST_F(TraceLogTest, SecondRunInfo) {
  const std::string prefix = testing::CraftedPrefix();
  testing::WriteBytes(path_, prefix + prefix.substr(16));
  EXPECT_EQ(At(prefix.size()) + "unexpected RunInfo frame (only the first frame may be RunInfo)",
            Read().status.message());
}

// --- index and footer ----------------------------------------------------------------

TEST_F(TraceLogTest, WriterDidNotFinish) {
  ShrinkTo(FrameOffset(7));  // a crash after the last data frame: no index, no footer
  ReadResult r = Read();
  EXPECT_EQ(written_, r.messages);
  EXPECT_EQ(Status::Code::kTruncated, r.status.code());
  EXPECT_EQ(At(FrameOffset(7)) +
                "file ends without index and footer: the writer did not finish (a crash, a write error such as a "
                "full disk, or a cut)",
            r.status.message());
}

TEST_F(TraceLogTest, MissingFooter) {
  ShrinkTo(IndexEnd());
  ReadResult r = Read();
  EXPECT_EQ(written_, r.messages);
  EXPECT_EQ(Status::Code::kTruncated, r.status.code());
  EXPECT_EQ(At(IndexEnd()) + "file ends after the index without its footer", r.status.message());
}

TEST_F(TraceLogTest, TruncatedFooter) {
  ShrinkTo(IndexEnd() + 11);
  ReadResult r = Read();
  EXPECT_EQ(written_, r.messages);
  EXPECT_EQ(At(IndexEnd()) + "truncated footer: 11 of 16 bytes", r.status.message());
  EXPECT_EQ(IndexEnd(), r.stop_offset);
}

TEST_F(TraceLogTest, BadFooterMagic) {
  IncrementByte(bytes_.size() - 2, 1);
  ReadResult r = Read();
  EXPECT_EQ(written_, r.messages);  // found by scanning
  EXPECT_EQ(Status::Code::kCorruption, r.status.code());
  EXPECT_EQ(At(IndexEnd()) + "bad footer magic", r.status.message());
}

TEST_F(TraceLogTest, FooterPointsElsewhere) {
  IncrementByte(IndexEnd(), 1);
  ReadResult r = Read();
  EXPECT_EQ(written_, r.messages);
  EXPECT_EQ(At(IndexEnd()) + "footer points at offset " + std::to_string(FrameOffset(7) + 1) +
                ", but the index starts at offset " + std::to_string(FrameOffset(7)),
            r.status.message());
}

TEST_F(TraceLogTest, CorruptIndexFallsBackToScanningAndIsReported) {
  IncrementByte(FrameOffset(7) + 17, 1);
  ASSERT_FALSE((*TraceReader::Open(path_))->has_index());
  ReadResult r = Read();
  EXPECT_EQ(written_, r.messages);
  EXPECT_TRUE(StartsWith(r.status.message(), At(FrameOffset(7)) + "checksum mismatch")) << r.status.message();
}

TEST_F(TraceLogTest, DataFrameAfterTheIndex) {
  const std::string data1 = bytes_.substr(FrameOffset(1), FrameOffset(2) - FrameOffset(1));
  testing::WriteBytes(path_, bytes_.substr(0, IndexEnd()) + data1);
  ReadResult r = Read();
  EXPECT_EQ(written_, r.messages);
  EXPECT_EQ(At(IndexEnd()) + "data frame after the index", r.status.message());
}

TEST_F(TraceLogTest, VerifyFindsAnIndexThatOmitsAFrame) {
  auto reader = TraceReader::Open(path_);
  pb::Index index = (*reader)->index();
  index.mutable_entries()->RemoveLast();
  std::string out = bytes_.substr(0, FrameOffset(7)) +
                    testing::PlainFrame(format::FrameType::kIndex, index.SerializeAsString()) +
                    bytes_.substr(IndexEnd());
  testing::WriteBytes(path_, out);
  EXPECT_TRUE(Read().status.ok());  // the frames themselves are fine
  Status s = VerifyFile(path_);
  EXPECT_EQ(Status::Code::kCorruption, s.code());
  EXPECT_EQ(At(FrameOffset(7)) + "index lists 5 frames, the file holds 6", s.message());
}

// Issue 12: VerifyFile counted frames of unknown (newer minor) types as data
// frames, then rejected the index, which rightly omits them.
TEST_F(TraceLogTest, VerifyIgnoresFramesOfNewerTypesThatTheIndexOmits) {
  auto reader = TraceReader::Open(path_);
  const pb::Index index = (*reader)->index();
  ASSERT_EQ(6, index.entries_size());
  // A type-9 frame after the last data frame; the index and footer move by its size.
  const std::string extra = testing::PlainFrame(static_cast<format::FrameType>(9), "from a newer minor");
  uint8_t footer[format::kFooterSize];
  frame_io::PutU64(footer, FrameOffset(7) + extra.size());
  std::memcpy(footer + 8, format::kFooterMagic, 8);
  bytes_ = bytes_.substr(0, FrameOffset(7)) + extra + bytes_.substr(FrameOffset(7), IndexEnd() - FrameOffset(7)) +
           std::string(reinterpret_cast<const char*>(footer), sizeof footer);
  SetByte(10, format::kMinorVersion + 1);  // a newer minor, which may define type 9
  ASSERT_TRUE((*TraceReader::Open(path_))->has_index());
  ReadResult r = Read();
  EXPECT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(written_, r.messages);
  EXPECT_EQ(7u, r.offsets.size());  // the newer frame is returned, with no message set
  Status s = VerifyFile(path_);
  EXPECT_TRUE(s.ok()) << s.message();
}

// Issue 12: scanning does not parse index frames, so --verify called a file
// valid whose index frame has a good CRC but an unparsable payload.
TEST_F(TraceLogTest, VerifyReportsAnUnparsableIndexFrame) {
  bytes_ = bytes_.substr(0, FrameOffset(7)) + testing::PlainFrame(format::FrameType::kIndex, "\xff\xff\xff");
  uint8_t footer[format::kFooterSize];
  frame_io::PutU64(footer, FrameOffset(7));
  std::memcpy(footer + 8, format::kFooterMagic, 8);
  bytes_ += std::string(reinterpret_cast<const char*>(footer), sizeof footer);
  Commit();
  ReadResult r = Read();
  EXPECT_TRUE(r.status.ok()) << r.status.message();  // reading scans and returns every frame
  EXPECT_EQ(written_, r.messages);
  Status s = VerifyFile(path_);
  EXPECT_EQ(Status::Code::kCorruption, s.code());
  EXPECT_EQ(At(FrameOffset(7)) + "cannot parse Index payload (3 bytes)", s.message());
}

// --- sweeps ---------------------------------------------------------------------------

// The offset where a reader of the file cut to `size` bytes must stop: the
// end of the last complete frame (or the start of the file header/RunInfo).
uint64_t ExpectedStop(const std::vector<uint64_t>& ends, uint64_t size) {
  uint64_t stop = size >= format::kFileHeaderSize ? format::kFileHeaderSize : 0;
  for (uint64_t e : ends)
    if (e <= size) stop = e;
  return stop;
}

TEST_F(TraceLogTest, CutAtEveryByteOffset) {
  const std::string whole = bytes_;
  for (uint64_t size = 0; size < whole.size(); ++size) {
    testing::WriteBytes(path_, whole.substr(0, size));
    ReadResult r = Read();
    const uint64_t stop = ExpectedStop(ends_, size);
    size_t complete = 0;  // data frames wholly inside the cut file
    for (size_t i = 1; i <= 6; ++i) complete += ends_[i] <= size;
    ASSERT_EQ(Status::Code::kTruncated, r.status.code()) << size << ": " << r.status.message();
    ASSERT_EQ(FirstWritten(complete), r.messages) << size;
    ASSERT_TRUE(StartsWith(r.status.message(), At(stop))) << size << ": " << r.status.message();
    if (r.opened) {
      ASSERT_EQ(stop, r.stop_offset) << size;
    }
  }
}

TEST_F(TraceLogTest, CutAtEveryFrameBoundaryAndMidFrame) {
  const std::string whole = bytes_;
  for (size_t frame = 1; frame < ends_.size(); ++frame) {
    for (uint64_t size : {FrameOffset(frame), FrameOffset(frame) + 7, FrameOffset(frame) + 16,
                          (FrameOffset(frame) + ends_[frame]) / 2, ends_[frame] - 1}) {
      testing::WriteBytes(path_, whole.substr(0, size));
      ReadResult r = Read();
      EXPECT_EQ(Status::Code::kTruncated, r.status.code()) << size;
      EXPECT_EQ(FirstWritten(std::min<size_t>(frame - 1, 6)), r.messages) << size;
      EXPECT_EQ(FrameOffset(frame), r.stop_offset) << size;
      EXPECT_TRUE(StartsWith(r.status.message(), At(FrameOffset(frame)))) << r.status.message();
    }
  }
}

// Every byte of the file, changed: the damage is reported (with the file and
// an offset) or, where the byte carries no data (version minor, the index
// flag), everything reads back exactly. Never a crash, never wrong data.
TEST_F(TraceLogTest, FlipEveryByte) {
  const std::string whole = bytes_;
  int silent = 0;
  for (uint8_t mask : {0x01, 0x80, 0xff}) {
    for (uint64_t i = 0; i < whole.size(); ++i) {
      std::string damaged = whole;
      damaged[i] = static_cast<char>(damaged[i] ^ mask);
      testing::WriteBytes(path_, damaged);
      ReadResult r = Read();
      // Whatever was returned is a prefix of what was written.
      ASSERT_LE(r.messages.size(), written_.size()) << i;
      ASSERT_EQ(FirstWritten(r.messages.size()), r.messages) << "byte " << i << " mask " << int(mask);
      if (r.status.ok()) {
        ASSERT_EQ(written_, r.messages) << i;
        ASSERT_TRUE(i == 10 || i == 11 || i == 12) << "undetected change at byte " << i << " mask " << int(mask);
        ++silent;
        continue;
      }
      ASSERT_TRUE(StartsWith(r.status.message(), path_ + ": offset ")) << i << ": " << r.status.message();
      ASSERT_FALSE(VerifyFile(path_).ok()) << i;
    }
  }
  EXPECT_LE(silent, 7);  // minor version bytes (harmless: a newer minor) and flag bit 0
}

// Heavier damage than one byte: several random bytes overwritten and a random
// cut, thousands of times. Whatever comes back is a prefix of what was
// written, and every failure names the file and an offset.
TEST_F(TraceLogTest, RandomDamageNeverYieldsWrongData) {
  const std::string whole = bytes_;
  std::mt19937 gen(5248);
  for (int iter = 0; iter < 3000; ++iter) {
    std::string damaged = whole;
    const int hits = 1 + static_cast<int>(gen() % 8);
    for (int h = 0; h < hits; ++h) damaged[gen() % damaged.size()] = static_cast<char>(gen());
    if (gen() % 2) damaged.resize(gen() % damaged.size());
    testing::WriteBytes(path_, damaged);
    ReadResult r = Read();
    ASSERT_LE(r.messages.size(), written_.size()) << iter;
    ASSERT_EQ(FirstWritten(r.messages.size()), r.messages) << iter;
    if (!r.status.ok()) {
      ASSERT_TRUE(StartsWith(r.status.message(), path_ + ": offset ")) << r.status.message();
    }
  }
}

}  // namespace
}  // namespace gradtrace
