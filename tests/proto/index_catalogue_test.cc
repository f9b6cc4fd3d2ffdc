// Format 1.1: index entries catalogue each BucketRecord frame, so readers can
// choose frames without decompressing them (issue 12). Old (1.0) indexes stay
// valid indexes but are not catalogues.
#include <gtest/gtest.h>

#include "index_entry.h"
#include "test_util.h"

namespace gradtrace {
namespace {

using testing::TempDir;

TEST(IndexCatalogue, WriterCataloguesEveryBucketFrame) {
  TempDir dir;
  const std::string path = dir.File("t.gtrace");
  testing::WriteSmallTrace(path, 2);
  auto r = TraceReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(format::kMinorVersion, (*r)->minor_version());
  EXPECT_TRUE((*r)->catalogued());
  int buckets = 0;
  for (const pb::IndexEntry& e : (*r)->index().entries()) {
    Frame f;
    ASSERT_TRUE((*r)->ReadAt(e.offset(), &f).ok());
    if (!f.bucket) continue;
    ++buckets;
    pb::IndexEntry want = CatalogueEntry(*f.bucket);
    want.set_offset(f.offset);
    want.set_type(f.type);
    want.set_raw_len(f.raw_len);
    EXPECT_EQ("", EntryMismatch(e, want, format::kMinorVersion));
    EXPECT_EQ(f.raw_len, e.raw_len());
    EXPECT_EQ(f.bucket->slices_size() > 0, e.param_ids_size() > 0);
  }
  EXPECT_EQ(4, buckets);
}

TEST(IndexCatalogue, EachChunkListsItsOwnParameters) {
  TempDir dir;
  const std::string path = dir.File("t.gtrace");
  const int64_t n = (format::kChunkTarget / 4) + 1000;
  pb::RunInfo run;
  *run.add_params() = testing::Param(0, "big", {n});
  *run.add_params() = testing::Param(1, "small", {10});
  std::vector<float> v(n, 0.5f);
  pb::BucketRecord rec;
  rec.set_step(1);
  rec.set_phase(pb::POST_REDUCE);
  rec.set_group("sdp");
  rec.set_divisor(2.0);
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
  const pb::Index& index = (*r)->index();
  ASSERT_EQ(2, index.entries_size());
  EXPECT_EQ((std::vector<int32_t>{0, 1}),
            std::vector<int32_t>(index.entries(0).param_ids().begin(), index.entries(0).param_ids().end()));
  EXPECT_EQ((std::vector<int32_t>{0}),
            std::vector<int32_t>(index.entries(1).param_ids().begin(), index.entries(1).param_ids().end()));
  for (const pb::IndexEntry& e : index.entries()) {
    EXPECT_EQ("sdp", e.group());
    EXPECT_EQ(2.0, e.divisor());
    EXPECT_LE(e.raw_len(), format::kChunkTarget);
  }
  EXPECT_TRUE(VerifyFile(path).ok());
}

// A file of one BucketRecord frame and an index listing it as `entry`.
std::string FileWithIndexEntry(uint16_t minor, const pb::BucketRecord& rec, pb::IndexEntry entry) {
  pb::RunInfo run = testing::SmallRun();
  run.set_model_fingerprint(ModelFingerprint(run));
  std::string bytes = testing::FileHeader(format::kMajorVersion, minor) +
                      testing::PlainFrame(format::FrameType::kRunInfo, run.SerializeAsString());
  const std::string payload = rec.SerializeAsString();
  entry.set_offset(bytes.size());
  entry.set_type(static_cast<uint32_t>(format::FrameType::kBucketRecord));
  entry.set_raw_len(static_cast<uint32_t>(payload.size()));
  bytes += testing::PlainFrame(format::FrameType::kBucketRecord, payload);
  const uint64_t index_offset = bytes.size();
  pb::Index index;
  *index.add_entries() = entry;
  bytes += testing::PlainFrame(format::FrameType::kIndex, index.SerializeAsString());
  uint8_t footer[format::kFooterSize];
  frame_io::PutU64(footer, index_offset);
  std::memcpy(footer + 8, format::kFooterMagic, 8);
  return bytes + std::string(reinterpret_cast<const char*>(footer), sizeof footer);
}

TEST(IndexCatalogue, VerifyReportsAWrongCatalogueField) {
  TempDir dir;
  const std::string path = dir.File("t.gtrace");
  const pb::RunInfo run = testing::SmallRun();
  const pb::BucketRecord rec = testing::Bucket(run, 0, 0, pb::FINAL);
  pb::IndexEntry entry = CatalogueEntry(rec);
  ASSERT_GE(entry.param_ids_size(), 1);
  entry.mutable_param_ids()->RemoveLast();
  testing::WriteBytes(path, FileWithIndexEntry(format::kMinorCataloguedIndex, rec, entry));
  Status s = VerifyFile(path);
  EXPECT_EQ(Status::Code::kCorruption, s.code());
  EXPECT_NE(std::string::npos,
            s.message().find("does not match the frame there: param ids (" + std::to_string(entry.param_ids_size()) +
                             " vs " + std::to_string(entry.param_ids_size() + 1) + " ids)"))
      << s.message();
}

TEST(IndexCatalogue, ParamIdOutsideTheTableMakesTheReaderScan) {
  TempDir dir;
  const std::string path = dir.File("t.gtrace");
  const pb::RunInfo run = testing::SmallRun();
  const pb::BucketRecord rec = testing::Bucket(run, 0, 0, pb::FINAL);
  pb::IndexEntry entry = CatalogueEntry(rec);
  entry.add_param_ids(run.params_size());  // one past the table
  testing::WriteBytes(path, FileWithIndexEntry(format::kMinorCataloguedIndex, rec, entry));
  auto r = TraceReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FALSE((*r)->has_index());
  EXPECT_FALSE((*r)->catalogued());
  testing::ReadResult res = testing::ReadAll(path);
  EXPECT_TRUE(res.status.ok()) << res.status.message();
  EXPECT_EQ(1u, res.messages.size());
  // Reading falls back to scanning; --verify says why.
  const Status v = VerifyFile(path);
  EXPECT_EQ(Status::Code::kCorruption, v.code());
  EXPECT_NE(std::string::npos,
            v.message().find(": index entry 0 lists parameter id " + std::to_string(run.params_size()) +
                             " (table has " + std::to_string(run.params_size()) + ", ids ascending): index ignored"))
      << v.message();
}

// Found in review (issue 12): entries were checked for ascending offsets only
// across index frames, not within the first one.
TEST(IndexCatalogue, EntriesOutOfOrderWithinOneFrameAreRefused) {
  TempDir dir;
  const std::string path = dir.File("t.gtrace");
  testing::WriteSmallTrace(path, 2);
  std::string bytes = testing::ReadBytes(path);
  auto r = TraceReader::Open(path);
  ASSERT_TRUE(r.ok());
  pb::Index index = (*r)->index();
  ASSERT_GE(index.entries_size(), 2);
  index.mutable_entries()->SwapElements(0, 1);
  // Replace the index frame(s) with one holding the swapped entries; same footer target.
  const uint64_t index_offset =
      frame_io::GetU64(reinterpret_cast<const uint8_t*>(bytes.data()) + bytes.size() - format::kFooterSize);
  bytes = bytes.substr(0, index_offset) + testing::PlainFrame(format::FrameType::kIndex, index.SerializeAsString()) +
          bytes.substr(bytes.size() - format::kFooterSize);
  testing::WriteBytes(path, bytes);
  auto again = TraceReader::Open(path);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_FALSE((*again)->has_index());
  const Status v = VerifyFile(path);
  EXPECT_EQ(Status::Code::kCorruption, v.code());
  EXPECT_NE(std::string::npos, v.message().find("index entry 1 (offset " + std::to_string(index.entries(1).offset()) +
                                                ") is not after the previous one"))
      << v.message();
}

TEST(IndexCatalogue, AVersion10IndexIsAnIndexButNotACatalogue) {
  TempDir dir;
  const std::string path = dir.File("t.gtrace");
  const pb::RunInfo run = testing::SmallRun();
  const pb::BucketRecord rec = testing::Bucket(run, 0, 0, pb::FINAL);
  pb::IndexEntry entry;  // what a 1.0 writer wrote: no catalogue fields
  entry.set_step(rec.step());
  entry.set_bucket_id(rec.bucket_id());
  entry.set_phase(rec.phase());
  testing::WriteBytes(path, FileWithIndexEntry(0, rec, entry));
  auto r = TraceReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(0, (*r)->minor_version());
  EXPECT_TRUE((*r)->has_index());
  EXPECT_FALSE((*r)->catalogued());
  EXPECT_TRUE(VerifyFile(path).ok()) << VerifyFile(path).message();
}

}  // namespace
}  // namespace gradtrace
