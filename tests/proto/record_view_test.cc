// record_view.h: a bucket record's full slices viewed in the payload must be
// exactly what protobuf's whole parse gives, on what writers write, on legal
// protobuf in other shapes (declined, then parsed whole by the reader), and on
// bytes that are not protobuf at all. fuzz_slice_decode checks the same
// equivalence on random payloads (docs/dev/fuzzing.md).
#include "record_view.h"

#include <gtest/gtest.h>

#include "parse_limits.h"
#include "test_util.h"
#include "trace_reader.h"
#include "trace_writer.h"
#include "validate.h"

namespace gradtrace {
namespace {

// A record in every payload kind: full slices of both parameters (one cut in two), a sketch and a stats slice, and
// an unknown field inside a slice and at the top.
pb::BucketRecord MixedRecord(const pb::RunInfo& run) {
  pb::BucketRecord r = testing::Bucket(run, 3, 1, pb::FINAL);
  const std::vector<float> v = testing::Floats(8, 9);
  const pb::ParamInfo& bias = run.params(1);
  std::vector<uint16_t> bf(8);
  for (size_t i = 0; i < bf.size(); ++i) bf[i] = static_cast<uint16_t>(0x3f80 + i);
  *r.add_slices() = MakeSlice(bias, 0, 3, pb::BF16, bf.data(), CaptureMode{});
  *r.add_slices() = MakeSlice(bias, 3, 5, pb::BF16, bf.data() + 3, CaptureMode{});
  *r.add_slices() = MakeSlice(run.params(0), 0, 8, pb::FP32, v.data(), CaptureMode{CaptureMode::Kind::kStats});
  *r.add_slices() = MakeSlice(run.params(0), 0, 128, pb::FP32, testing::Floats(128, 2).data(),
                              CaptureMode{CaptureMode::Kind::kSketch, 16});
  r.mutable_slices(1)->GetReflection()->MutableUnknownFields(r.mutable_slices(1))->AddVarint(99, 7);
  r.GetReflection()->MutableUnknownFields(&r)->AddLengthDelimited(98, "unknown");
  return r;
}

// The skeleton parsed, its full slices given back their bytes: the record itself.
void ExpectSameRecord(const std::string& payload) {
  pb::BucketRecord whole;
  ASSERT_TRUE(whole.ParseFromString(payload));
  std::string skeleton;
  std::vector<std::string_view> data;
  ASSERT_TRUE(SplitFullData(payload, &skeleton, &data));
  size_t viewed = 0;
  for (std::string_view d : data) viewed += d.size();
  EXPECT_LE(skeleton.size() + viewed, payload.size());  // the bytes are not in the skeleton
  pb::BucketRecord split;
  ASSERT_TRUE(split.ParseFromString(skeleton));
  ASSERT_EQ(data.size(), static_cast<size_t>(whole.slices_size()));
  for (int i = 0; i < split.slices_size(); ++i) {
    const pb::Slice& s = split.slices(i);
    EXPECT_EQ(s.has_full(), whole.slices(i).has_full()) << i;
    if (!s.has_full()) continue;
    EXPECT_TRUE(s.full().data().empty()) << i;
    EXPECT_EQ(data[i], whole.slices(i).full().data()) << i;
    split.mutable_slices(i)->mutable_full()->set_data(std::string(data[i]));
  }
  EXPECT_EQ(split.SerializeAsString(), whole.SerializeAsString());
}

TEST(RecordView, WhatWritersWriteSplitsIntoTheSameRecord) {
  const pb::RunInfo run = testing::SmallRun();
  ExpectSameRecord(MixedRecord(run).SerializeAsString());
  ExpectSameRecord(testing::Bucket(run, 0, 0, pb::POST_REDUCE).SerializeAsString());
  ExpectSameRecord(pb::BucketRecord().SerializeAsString());
}

// Legal protobuf a writer never makes: two `full` fields in one slice merge, two `data` fields keep the last.
// Declined, so the reader parses them whole.
TEST(RecordView, OtherShapesAreDeclined) {
  const pb::RunInfo run = testing::SmallRun();
  const pb::BucketRecord r = testing::Bucket(run, 0, 0, pb::FINAL);
  pb::Slice extra;
  extra.mutable_full()->set_shuffled(false);
  std::string skeleton;
  std::vector<std::string_view> data;
  // Two `full` fields on the wire: build the slice's bytes by hand.
  const std::string slice_bytes = r.slices(0).SerializeAsString() + extra.SerializeAsString();
  pb::BucketRecord shell;
  shell.GetReflection()->MutableUnknownFields(&shell)->AddLengthDelimited(pb::BucketRecord::kSlicesFieldNumber,
                                                                          slice_bytes);
  EXPECT_FALSE(SplitFullData(shell.SerializeAsString(), &skeleton, &data));
  pb::FullPayload two_data;
  two_data.GetReflection()->MutableUnknownFields(&two_data)->AddLengthDelimited(pb::FullPayload::kDataFieldNumber, "a");
  two_data.GetReflection()->MutableUnknownFields(&two_data)->AddLengthDelimited(pb::FullPayload::kDataFieldNumber, "b");
  pb::Slice s;
  s.GetReflection()->MutableUnknownFields(&s)->AddLengthDelimited(pb::Slice::kFullFieldNumber,
                                                                  two_data.SerializeAsString());
  pb::BucketRecord r2;
  *r2.add_slices() = s;
  EXPECT_FALSE(SplitFullData(r2.SerializeAsString(), &skeleton, &data));
  // Groups are not this shape either.
  EXPECT_FALSE(SplitFullData(std::string("\x0b\x0c", 2), &skeleton, &data));
}

// Every prefix of a real payload, and every single-byte change of it: never a crash, and whenever the split is
// taken, the skeleton parses exactly when the payload does, with the same record.
TEST(RecordView, DamagedPayloadsSplitOnlyIntoTheSameRecord) {
  const std::string payload = MixedRecord(testing::SmallRun()).SerializeAsString();
  auto check = [](const std::string& bytes) {
    std::string skeleton;
    std::vector<std::string_view> data;
    if (!SplitFullData(bytes, &skeleton, &data)) return;
    pb::BucketRecord whole, split;
    const bool whole_ok = whole.ParseFromString(bytes), split_ok = split.ParseFromString(skeleton);
    ASSERT_EQ(whole_ok, split_ok);
    if (!whole_ok) return;
    ASSERT_EQ(data.size(), static_cast<size_t>(whole.slices_size()));
    for (int i = 0; i < split.slices_size(); ++i) {
      if (split.slices(i).has_full()) split.mutable_slices(i)->mutable_full()->set_data(std::string(data[i]));
    }
    ASSERT_EQ(split.SerializeAsString(), whole.SerializeAsString());
  };
  for (size_t n = 0; n <= payload.size(); ++n) check(payload.substr(0, n));
  for (size_t i = 0; i < payload.size(); ++i) {
    for (int b : {0x00, 0x7f, 0x80, 0xff}) {
      std::string bytes = payload;
      bytes[i] = static_cast<char>(b);
      check(bytes);
    }
  }
}

// The reader's view of a written frame: the same slices, bytes and checks as its whole decode.
TEST(RecordView, DecodeStoredViewMatchesDecodeStored) {
  testing::TempDir dir;
  const std::string path = dir.File("rank-00000.gtrace");
  const pb::RunInfo run = testing::SmallRun();
  {
    auto w = TraceWriter::Open(path, run);
    ASSERT_TRUE(w.ok()) << w.status().message();
    ASSERT_TRUE((*w)->WriteBucket(MixedRecord(run)).ok());
    ASSERT_TRUE((*w)->Close().ok());
  }
  auto r = TraceReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  Frame first;
  ASSERT_TRUE((*r)->Next(&first));
  ASSERT_TRUE(first.bucket);
  TraceReader::StoredFrame stored;
  ASSERT_TRUE((*r)->ReadStoredAt(first.offset, &stored).ok());
  RecordView view;
  ASSERT_TRUE((*r)->DecodeStoredView(stored, &view).ok());
  ASSERT_EQ(view.record().slices_size(), first.bucket->slices_size());
  for (int i = 0; i < first.bucket->slices_size(); ++i) {
    EXPECT_EQ(view.data(i), first.bucket->slices(i).full().data()) << i;
  }
  EXPECT_EQ(view.raw_len(), first.raw_len);
  // A flipped byte in the stored payload: DecodeStored's error, word for word.
  stored.bytes[stored.bytes.size() / 2] ^= 1;
  Frame again;
  TraceReader::StoredFrame copy = stored;
  const Status whole = (*r)->DecodeStored(copy, &again);
  const Status viewed = (*r)->DecodeStoredView(stored, &view);
  ASSERT_FALSE(viewed.ok());
  EXPECT_EQ(viewed.message(), whole.message());
}

// ReadView against ReadStoredAt + DecodeStoredView at `offset`: the same status (code and words) and, read, the same
// record, bytes and (kept) stored frame; without `keep` too.
void ExpectReadViewAsTwoSteps(TraceReader& r, uint64_t offset, const std::string& what) {
  SCOPED_TRACE(what + ", offset " + std::to_string(offset));
  TraceReader::StoredFrame stored;
  RecordView two;
  Status expected = r.ReadStoredAt(offset, &stored);
  if (expected.ok()) expected = r.DecodeStoredView(stored, &two);
  for (bool keep : {true, false}) {
    TraceReader::StoredFrame kept;
    RecordView one;
    const Status got = r.ReadView(offset, &one, keep ? &kept : nullptr);
    ASSERT_EQ(got.code(), expected.code()) << got.message() << " | " << expected.message();
    EXPECT_EQ(got.message(), expected.message());
    if (!got.ok()) continue;
    EXPECT_EQ(one.record().SerializeAsString(), two.record().SerializeAsString());
    ASSERT_EQ(one.record().slices_size(), two.record().slices_size());
    for (int i = 0; i < one.record().slices_size(); ++i) EXPECT_EQ(one.data(i), two.data(i)) << i;
    EXPECT_EQ(one.raw_len(), two.raw_len());
    if (keep) {
      EXPECT_TRUE(kept.SameBytes(stored));
      EXPECT_EQ(kept.offset, offset);
    }
  }
}

// Every frame of the file at `path` (frames at `offsets`), both ways; a file that no longer opens is skipped.
void ExpectEveryFrameAsTwoSteps(const std::string& path, const std::vector<uint64_t>& offsets,
                                const std::string& what) {
  auto r = TraceReader::Open(path);
  if (!r.ok()) return;
  for (uint64_t off : offsets) ExpectReadViewAsTwoSteps(**r, off, what);
}

// A run whose third parameter (1 MiB of fp32) makes a frame of several of ReadView's pieces.
pb::RunInfo RunWithABigParam() {
  pb::RunInfo run = testing::SmallRun();
  *run.add_params() = testing::Param(2, "big.weight", {256, 1024});
  return run;
}

// ReadView reads a frame in pieces, the CRC and zstd fed as they come; on whatever bytes it meets it must answer
// what the two-step read answers: written frames (one piece and several), an uncompressed frame, a bit flipped at
// every header byte, at and around every piece boundary and elsewhere, and a file cut inside the big frame.
TEST(RecordView, ReadViewAnswersAsTheTwoStepRead) {
  testing::TempDir dir;
  const std::string path = dir.File("rank-00000.gtrace");
  const pb::RunInfo run = RunWithABigParam();
  {
    auto w = TraceWriter::Open(path, run);
    ASSERT_TRUE(w.ok()) << w.status().message();
    ASSERT_TRUE((*w)->WriteBucket(MixedRecord(run)).ok());
    pb::BucketRecord big = testing::Bucket(run, 0, 2, pb::FINAL);
    const pb::ParamInfo& p = run.params(2);
    *big.add_slices() = MakeSlice(p, 0, p.numel(), pb::FP32, testing::Floats(p.numel(), 5).data(), CaptureMode{});
    ASSERT_TRUE((*w)->WriteBucket(big).ok());
    ASSERT_TRUE((*w)->WriteStep(testing::Step(0)).ok());
    ASSERT_TRUE((*w)->Close().ok());
  }
  const std::string bytes = testing::ReadBytes(path);
  const std::vector<uint64_t> ends = testing::FrameEnds(bytes);
  ASSERT_GE(ends.size(), 4u);
  const std::vector<uint64_t> offsets(ends.begin(), ends.begin() + 3);  // the two records and the step
  const uint64_t big_at = offsets[1], big_end = ends[2];
  ASSERT_GT(big_end - big_at, uint64_t{600} << 10);  // several pieces of 192 KiB
  ExpectEveryFrameAsTwoSteps(path, offsets, "as written");

  std::vector<uint64_t> flips;
  for (uint64_t i = 0; i < format::kFrameHeaderSize; ++i) flips.push_back(big_at + i);
  const uint64_t payload_at = big_at + format::kFrameHeaderSize;
  for (uint64_t piece = 0; payload_at + piece < big_end; piece += uint64_t{192} << 10) {
    for (int d : {-1, 0, 1}) {
      const uint64_t at = payload_at + piece + static_cast<uint64_t>(d);
      if (at > payload_at && at < big_end) flips.push_back(at);
    }
  }
  for (uint64_t at = payload_at + 7; at < big_end; at += 40009) flips.push_back(at);
  flips.push_back(big_end - 1);
  for (uint64_t at : flips) {
    std::string damaged = bytes;
    damaged[at] = static_cast<char>(damaged[at] ^ 0x10);
    testing::WriteBytes(path, damaged);
    ExpectEveryFrameAsTwoSteps(path, offsets, "bit flipped at " + std::to_string(at));
  }
  for (uint64_t cut : {payload_at + 100, payload_at + (uint64_t{192} << 10), big_end - 1}) {
    testing::WriteBytes(path, bytes.substr(0, cut));
    ExpectEveryFrameAsTwoSteps(path, offsets, "cut at " + std::to_string(cut));
  }

  // A bucket record stored uncompressed (codec 0): not ReadView's own pass, the same answer.
  const std::string plain = dir.File("plain.gtrace");
  const std::string prefix = testing::CraftedPrefix();
  testing::WriteBytes(plain, prefix + testing::PlainFrame(format::FrameType::kBucketRecord,
                                                          MixedRecord(testing::SmallRun()).SerializeAsString()));
  ExpectEveryFrameAsTwoSteps(plain, {prefix.size()}, "uncompressed");
}

}  // namespace
}  // namespace gradtrace
