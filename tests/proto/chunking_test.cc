// Splitting oversized bucket records into frames and joining them back.
#include "chunking.h"

#include <gtest/gtest.h>

#include "test_util.h"
#include "validate.h"

namespace gradtrace {
namespace {

pb::RunInfo ThreeParamRun() {
  pb::RunInfo run;
  *run.add_params() = testing::Param(0, "a", {10000});
  *run.add_params() = testing::Param(1, "b", {300}, pb::FP16);
  *run.add_params() = testing::Param(2, "c", {5000}, pb::FP64);
  return run;
}

pb::BucketRecord MixedRecord(const pb::RunInfo& run) {
  pb::BucketRecord r;
  r.set_step(7);
  r.set_micro_step(1);
  r.set_bucket_id(3);
  r.set_phase(pb::POST_REDUCE);
  r.set_group("sdp");
  r.set_divisor(4);
  const std::vector<float> a = testing::Floats(10000, 1);
  std::vector<uint16_t> b(300);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint16_t>(0x3c00 + i);
  std::vector<double> c(5000);
  for (size_t i = 0; i < c.size(); ++i) c[i] = i * 0.25;
  *r.add_slices() = MakeSlice(run.params(0), 0, 10000, pb::FP32, a.data(), CaptureMode{});
  *r.add_slices() = MakeSlice(run.params(1), 0, 300, pb::FP16, b.data(), CaptureMode{CaptureMode::Kind::kStats, 0});
  *r.add_slices() =
      MakeSlice(run.params(2), 1000, 4000, pb::FP64, c.data() + 1000, CaptureMode{CaptureMode::Kind::kSketch, 2000});
  *r.add_slices() = MakeSlice(run.params(1), 0, 300, pb::FP16, b.data(), CaptureMode{});
  return r;
}

TEST(Chunking, RecordThatFitsIsUntouched) {
  const pb::RunInfo run = ThreeParamRun();
  const pb::BucketRecord r = MixedRecord(run);
  auto chunks = SplitRecord(r, r.ByteSizeLong());
  ASSERT_TRUE(chunks.ok());
  ASSERT_EQ(1u, chunks->size());
  EXPECT_EQ(r.SerializeAsString(), (*chunks)[0].SerializeAsString());
}

TEST(Chunking, SplitsUnderTargetAndMergesByteExact) {
  const pb::RunInfo run = ThreeParamRun();
  const pb::BucketRecord r = MixedRecord(run);
  for (size_t target : {1000u, 4096u, 10007u, 30000u}) {
    auto chunks = SplitRecord(r, target);
    ASSERT_TRUE(chunks.ok()) << chunks.status().message();
    ASSERT_GT(chunks->size(), r.ByteSizeLong() / target) << target;
    for (size_t i = 0; i < chunks->size(); ++i) {
      const pb::BucketRecord& c = (*chunks)[i];
      EXPECT_LE(c.ByteSizeLong(), target);
      EXPECT_EQ(static_cast<int>(i), c.chunk());
      EXPECT_EQ(static_cast<int>(chunks->size()), c.chunk_count());
      EXPECT_EQ(7, c.step());
      EXPECT_EQ(3, c.bucket_id());
      EXPECT_EQ(4.0, c.divisor());
      EXPECT_TRUE(ValidateBucketRecord(run, c).ok()) << ValidateBucketRecord(run, c).message();
    }
    // Any order in, the original out.
    std::vector<pb::BucketRecord> shuffled(chunks->rbegin(), chunks->rend());
    auto merged = MergeChunks(std::move(shuffled));
    ASSERT_TRUE(merged.ok()) << merged.status().message();
    EXPECT_EQ(r.SerializeAsString(), merged->SerializeAsString()) << target;
  }
}

TEST(Chunking, MissingChunkIsCorruption) {
  const pb::RunInfo run = ThreeParamRun();
  auto chunks = SplitRecord(MixedRecord(run), 4096);
  ASSERT_TRUE(chunks.ok());
  chunks->erase(chunks->begin() + 2);
  auto merged = MergeChunks(*chunks);
  ASSERT_FALSE(merged.ok());
  EXPECT_EQ(Status::Code::kCorruption, merged.status().code());
  EXPECT_NE(std::string::npos, merged.status().message().find("incomplete")) << merged.status().message();
}

TEST(Chunking, ChunksOfDifferentRecordsAreRefused) {
  const pb::RunInfo run = ThreeParamRun();
  auto chunks = SplitRecord(MixedRecord(run), 4096);
  ASSERT_TRUE(chunks.ok());
  (*chunks)[1].set_step(8);
  EXPECT_EQ(Status::Code::kCorruption, MergeChunks(*chunks).status().code());
}

TEST(Chunking, ContinuedSliceThatDoesNotJoinIsCorruption) {
  const pb::RunInfo run = ThreeParamRun();
  auto chunks = SplitRecord(MixedRecord(run), 4096);
  ASSERT_TRUE(chunks.ok());
  ASSERT_TRUE((*chunks)[0].last_slice_continues());
  (*chunks)[1].mutable_slices(0)->set_offset((*chunks)[1].slices(0).offset() + 1);
  auto merged = MergeChunks(*chunks);
  ASSERT_FALSE(merged.ok());
  EXPECT_NE(std::string::npos, merged.status().message().find("does not join")) << merged.status().message();
}

TEST(Chunking, UncuttableSliceLargerThanTargetIsRefused) {
  const pb::RunInfo run = ThreeParamRun();
  pb::BucketRecord r;
  std::vector<uint16_t> b(300, 0x3c00);
  pb::Slice s = MakeSlice(run.params(1), 0, 300, pb::FP16, b.data(), CaptureMode{CaptureMode::Kind::kStats, 0});
  for (int i = 0; i < 40; ++i) *r.add_slices() = s;
  auto chunks = SplitRecord(r, 200);  // more than one stats slice per chunk never fits
  ASSERT_TRUE(chunks.ok()) << chunks.status().message();
  EXPECT_EQ(40u, chunks->size());
  EXPECT_EQ(Status::Code::kInvalidArgument, SplitRecord(r, 100).status().code());
}

TEST(Chunking, LoneRecordMergesToItself) {
  const pb::RunInfo run = ThreeParamRun();
  const pb::BucketRecord r = MixedRecord(run);
  auto merged = MergeChunks({r});
  ASSERT_TRUE(merged.ok());
  EXPECT_EQ(r.SerializeAsString(), merged->SerializeAsString());
}

}  // namespace
}  // namespace gradtrace
