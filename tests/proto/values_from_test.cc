// Format 1.6's records by reference (values_from, FORMAT.md 4.3): every read
// path gives a reference the values of its target, as if they had been written
// again; a reference that is not exactly what a writer makes is refused with
// a message naming it; resolving references is bounded however many there are.
#include "values_from.h"

#include <gtest/gtest.h>

#include <map>
#include <utility>
#include <vector>

#include "slice_codec.h"
#include "test_util.h"
#include "trace_reader.h"
#include "trace_writer.h"

namespace gradtrace {
namespace {

using testing::Bucket;
using testing::SmallRun;

// `r` as a reference must read: its own fields, the target's values, values_from set.
pb::BucketRecord Resolved(pb::BucketRecord values, const pb::BucketRecord& meta, uint64_t from) {
  values.set_phase(meta.phase());
  values.set_group(meta.group());
  values.set_divisor(meta.divisor());
  values.set_values_from(from);
  return values;
}

pb::BucketRecord Meta(int64_t step, int bucket, pb::Phase phase, double divisor) {
  pb::BucketRecord m;
  m.set_step(step);
  m.set_bucket_id(bucket);
  m.set_phase(phase);
  m.set_group(phase == pb::FINAL ? "" : "sp");
  m.set_divisor(divisor);
  return m;
}

// A run with one parameter of 3 Mi fp32 elements: its record is cut into chunks (4 MiB each at most).
pb::RunInfo LargeRun() {
  pb::RunInfo run = SmallRun();
  *run.mutable_params(0) = testing::Param(0, "embed.weight", {3, 1 << 20});
  return run;
}

pb::BucketRecord LargeRecord(const pb::RunInfo& run) {
  pb::BucketRecord r;
  r.set_step(0);
  r.set_bucket_id(0);
  r.set_phase(pb::PRE_REDUCE);
  r.set_group("sp");
  const pb::ParamInfo& p = run.params(0);
  const std::vector<float> v = testing::Floats(static_cast<size_t>(p.numel()), 5);
  *r.add_slices() = MakeSlice(p, 0, p.numel(), pb::FP32, v.data(), CaptureMode{});
  return r;
}

// Every read path of the reader, on every data frame: serialized records in file order.
struct EveryPath {
  std::vector<std::string> next, read_at, decode_stored, view;
};

EveryPath ReadEveryPath(const std::string& path, ReadOptions options = {}) {
  EveryPath out;
  auto r = TraceReader::Open(path, options);
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (!r.ok()) return out;
  std::vector<uint64_t> offsets;
  Frame f;
  while ((*r)->Next(&f)) {
    if (!f.bucket) continue;
    offsets.push_back(f.offset);
    out.next.push_back(f.bucket->SerializeAsString());
  }
  EXPECT_TRUE((*r)->status().ok()) << (*r)->status().message();
  for (uint64_t o : offsets) {
    Frame g;
    EXPECT_TRUE((*r)->ReadAt(o, &g).ok());
    out.read_at.push_back(g.bucket ? g.bucket->SerializeAsString() : "");
    TraceReader::StoredFrame stored;
    Frame h;
    EXPECT_TRUE((*r)->ReadStoredAt(o, &stored).ok());
    EXPECT_TRUE((*r)->DecodeStored(stored, &h).ok());
    out.decode_stored.push_back(h.bucket ? h.bucket->SerializeAsString() : "");
    RecordView view;
    Status st = (*r)->ReadView(o, &view);
    EXPECT_TRUE(st.ok()) << st.message();
    pb::BucketRecord whole = view.record();
    for (int i = 0; i < whole.slices_size(); ++i) {
      if (whole.slices(i).has_full()) whole.mutable_slices(i)->mutable_full()->set_data(std::string(view.data(i)));
    }
    out.view.push_back(whole.SerializeAsString());
  }
  return out;
}

TEST(ValuesFrom, EveryReadPathGivesAReferenceItsTargetsValues) {
  testing::TempDir dir;
  const std::string path = dir.File("rank-00001.gtrace");
  const pb::RunInfo run = LargeRun();
  const pb::BucketRecord pre = LargeRecord(run);
  const pb::BucketRecord post_meta = Meta(0, 0, pb::POST_REDUCE, 1);
  const pb::BucketRecord final_meta = Meta(0, 0, pb::FINAL, 0);
  std::vector<WrittenFrame> written;
  {
    auto w = TraceWriter::Open(path, run);
    ASSERT_TRUE(w.ok()) << w.status().message();
    ASSERT_TRUE((*w)->WriteBucket(pre, &written).ok());
    ASSERT_GE(written.size(), 3u);  // 12 MiB of values: chunks
    ASSERT_TRUE((*w)->WriteBucketValuesOf(post_meta, written).ok());
    ASSERT_TRUE((*w)->WriteBucketValuesOf(final_meta, written).ok());
    ASSERT_TRUE((*w)->Close().ok());
  }
  // What a reader must see: the chunks, then each again under POST's and FINAL's fields.
  auto chunked = TraceReader::Open(path);
  ASSERT_TRUE(chunked.ok());
  std::vector<std::string> expected;
  std::vector<pb::BucketRecord> chunks;
  Frame f;
  for (size_t i = 0; i < written.size() && (*chunked)->Next(&f); ++i) chunks.push_back(*f.bucket);
  ASSERT_EQ(chunks.size(), written.size());
  for (const pb::BucketRecord& c : chunks) expected.push_back(c.SerializeAsString());
  for (const pb::BucketRecord* meta : {&post_meta, &final_meta}) {
    for (size_t i = 0; i < chunks.size(); ++i) {
      expected.push_back(Resolved(chunks[i], *meta, written[i].offset).SerializeAsString());
    }
  }
  for (bool use_index : {true, false}) {
    SCOPED_TRACE(use_index ? "index" : "scan");
    const EveryPath got = ReadEveryPath(path, ReadOptions{use_index, nullptr});
    EXPECT_EQ(got.next, expected);
    EXPECT_EQ(got.read_at, expected);
    EXPECT_EQ(got.decode_stored, expected);
    EXPECT_EQ(got.view, expected);
  }
  EXPECT_TRUE(VerifyFile(path).ok()) << VerifyFile(path).message();
  // The references are small: the file holds the values once.
  uint64_t values = 0;
  for (const WrittenFrame& w : written) values += w.stored_len + format::kFrameHeaderSize;
  EXPECT_LT(testing::ReadBytes(path).size(), values + 4096);
}

TEST(ValuesFrom, WriterRefusesWhatIsNotAReferenceAndWritesReadRecordsInFull) {
  testing::TempDir dir;
  const pb::RunInfo run = SmallRun();
  auto w = TraceWriter::Open(dir.File("rank-00001.gtrace"), run);
  ASSERT_TRUE(w.ok());
  std::vector<WrittenFrame> written;
  ASSERT_TRUE((*w)->WriteBucket(Bucket(run, 0, 0, pb::PRE_REDUCE), &written).ok());
  ASSERT_EQ(written.size(), 1u);
  EXPECT_TRUE(written[0].referable());  // random values: no 16 to 1
  const uint64_t before = (*w)->bytes_written();
  EXPECT_EQ((*w)->WriteBucketValuesOf(Bucket(run, 0, 0, pb::FINAL), written).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ((*w)->WriteBucketValuesOf(Meta(0, 0, pb::FINAL, 0), {}).code(), Status::Code::kInvalidArgument);
  WrittenFrame later = written[0];
  later.offset = before;  // not written before
  EXPECT_EQ((*w)->WriteBucketValuesOf(Meta(0, 0, pb::FINAL, 0), {later}).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ((*w)->bytes_written(), before);
  // A record read by reference holds its values: written back, it is written in full.
  pb::BucketRecord read_back = Bucket(run, 0, 0, pb::FINAL);
  read_back.set_values_from(written[0].offset);
  std::vector<WrittenFrame> again;
  ASSERT_TRUE((*w)->WriteBucket(read_back, &again).ok());
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].skeleton.values_from(), 0u);
  ASSERT_TRUE((*w)->Close().ok());
  const testing::ReadResult r = testing::ReadAll(dir.File("rank-00001.gtrace"));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  ASSERT_EQ(r.messages.size(), 2u);
  read_back.clear_values_from();
  EXPECT_EQ(r.messages[1], read_back.SerializeAsString());
}

// A crafted file: the small RunInfo, frames appended, no index.
struct Crafted {
  std::string bytes = testing::CraftedPrefix();
  uint64_t Add(format::FrameType type, const std::string& payload) {
    const uint64_t at = bytes.size();
    bytes += testing::PlainFrame(type, payload);
    return at;
  }
};

// The reference at the end of `c` must be refused, by every read path, naming values_from and `why`.
void ExpectRefused(const Crafted& c, uint64_t ref_offset, const std::string& why) {
  testing::TempDir dir;
  const std::string path = dir.File("rank-00001.gtrace");
  testing::WriteBytes(path, c.bytes);
  auto r = TraceReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  Frame f;
  while ((*r)->Next(&f)) {
  }
  const Status& st = (*r)->status();
  EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.message();
  EXPECT_NE(st.message().find("offset " + std::to_string(ref_offset) + ": values_from"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find(why), std::string::npos) << st.message();
  RecordView view;
  const Status v = (*r)->ReadView(ref_offset, &view);
  EXPECT_EQ(v.code(), Status::Code::kCorruption) << v.message();
  EXPECT_NE(v.message().find(why), std::string::npos) << v.message();
  // Read into a view holding an earlier frame, the one it names among them: refused alike.
  for (uint64_t held = 0; held < ref_offset; ++held) {
    RecordView onto;
    if (!(*r)->ReadView(held, &onto).ok()) continue;
    const Status o = (*r)->ReadView(ref_offset, &onto);
    EXPECT_EQ(o.code(), Status::Code::kCorruption) << "holding offset " << held << ": " << o.message();
    EXPECT_NE(o.message().find(why), std::string::npos) << "holding offset " << held << ": " << o.message();
  }
}

pb::BucketRecord RefTo(const pb::BucketRecord& target, uint64_t from) {
  pb::BucketRecord ref = target;
  ref.set_phase(pb::FINAL);
  for (pb::Slice& s : *ref.mutable_slices()) s.mutable_full()->Clear();
  ref.set_values_from(from);
  return ref;
}

TEST(ValuesFrom, ReferencesAWriterNeverMakesAreRefused) {
  const pb::RunInfo run = SmallRun();
  const pb::BucketRecord pre = Bucket(run, 0, 0, pb::PRE_REDUCE);
  const std::string step = testing::Step(0).SerializeAsString();
  auto with = [&](auto edit, const std::string& why) {
    SCOPED_TRACE(why);
    Crafted c;
    const uint64_t s = c.Add(format::FrameType::kStepInfo, step);
    const uint64_t t = c.Add(format::FrameType::kBucketRecord, pre.SerializeAsString());
    pb::BucketRecord ref = RefTo(pre, t);
    const uint64_t at = c.bytes.size();
    edit(ref, s, t, at);
    c.Add(format::FrameType::kBucketRecord, ref.SerializeAsString());
    ExpectRefused(c, at, why);
  };
  using R = pb::BucketRecord;
  with([](R& r, uint64_t, uint64_t, uint64_t at) { r.set_values_from(at); }, "not an earlier data frame");
  with([](R& r, uint64_t, uint64_t, uint64_t at) { r.set_values_from(at + 16); }, "not an earlier data frame");
  with([](R& r, uint64_t, uint64_t, uint64_t) { r.set_values_from(3); }, "not an earlier data frame");
  with([](R& r, uint64_t s, uint64_t, uint64_t) { r.set_values_from(s); }, "not a bucket record frame");
  with([](R& r, uint64_t, uint64_t t, uint64_t) { r.set_values_from(t + 5); }, "values_from");
  with([](R& r, uint64_t, uint64_t, uint64_t) { r.mutable_slices(0)->set_offset(1); }, "slice 0: param 0");
  with([](R& r, uint64_t, uint64_t, uint64_t) { r.mutable_slices(0)->set_dtype(pb::BF16); }, "slice 0: param 0");
  with([](R& r, uint64_t, uint64_t, uint64_t) { *r.add_slices() = r.slices(0); }, "holds 1 slices, the reference 2");
  with([](R& r, uint64_t, uint64_t, uint64_t) { r.mutable_slices(0)->mutable_full()->set_data("abcd"); },
       "not an empty full payload");
  with([](R& r, uint64_t, uint64_t, uint64_t) { r.mutable_slices(0)->mutable_stats(); }, "not an empty full payload");

  // A reference to a reference; a reference to a frame holding no full values.
  {
    Crafted c;
    const uint64_t t = c.Add(format::FrameType::kBucketRecord, pre.SerializeAsString());
    const uint64_t r1 = c.Add(format::FrameType::kBucketRecord, RefTo(pre, t).SerializeAsString());
    const uint64_t at = c.Add(format::FrameType::kBucketRecord, RefTo(pre, r1).SerializeAsString());
    ExpectRefused(c, at, "a reference itself");
  }
  {
    Crafted c;
    pb::BucketRecord stats = pre;
    *stats.mutable_slices(0) = MakeSlice(run.params(0), 0, run.params(0).numel(), pb::FP32,
                                         testing::Floats(128, 1).data(), CaptureMode{CaptureMode::Kind::kStats});
    const uint64_t t = c.Add(format::FrameType::kBucketRecord, stats.SerializeAsString());
    const uint64_t at = c.Add(format::FrameType::kBucketRecord, RefTo(pre, t).SerializeAsString());
    ExpectRefused(c, at, "slice 0: not full values");
  }
}

// A file of many references to one frame of zeros (a few bytes each, 4 MiB to decode each): the reader stops at its
// budget (256 times the file plus 256 MiB) with LimitExceeded, instead of decoding without end.
TEST(ValuesFrom, ResolvingIsBoundedOverAReadersLife) {
  testing::TempDir dir;
  const std::string path = dir.File("rank-00001.gtrace");
  pb::RunInfo run = SmallRun();
  *run.mutable_params(0) = testing::Param(0, "embed.weight", {1 << 19});
  pb::BucketRecord zeros;
  zeros.set_phase(pb::PRE_REDUCE);
  zeros.set_group("sp");
  const std::vector<float> z(1 << 19);
  *zeros.add_slices() = MakeSlice(run.params(0), 0, 1 << 19, pb::FP32, z.data(), CaptureMode{});
  std::vector<WrittenFrame> written;
  {
    auto w = TraceWriter::Open(path, run);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->WriteBucket(zeros, &written).ok());
    ASSERT_EQ(written.size(), 1u);
    EXPECT_FALSE(written[0].referable());  // what the capture would not refer to
    for (int i = 0; i < 400; ++i) ASSERT_TRUE((*w)->WriteBucketValuesOf(Meta(0, 0, pb::FINAL, 0), written).ok());
    ASSERT_TRUE((*w)->Close().ok());
  }
  const uint64_t size = testing::ReadBytes(path).size();
  ASSERT_LT(size, 64u << 10);
  const uint64_t budget = format::kReferenceDecodeFactor * size + format::kReferenceDecodeSlack;
  const uint64_t resolvable = budget / written[0].raw_len;  // references resolved before the budget runs out
  ASSERT_LT(resolvable, 400u);
  auto r = TraceReader::Open(path);
  ASSERT_TRUE(r.ok());
  Frame f;
  uint64_t frames = 0;
  while ((*r)->Next(&f)) ++frames;
  EXPECT_EQ(frames, 1 + resolvable);
  EXPECT_EQ((*r)->status().code(), Status::Code::kLimitExceeded) << (*r)->status().message();
  EXPECT_NE((*r)->status().message().find("references have decoded"), std::string::npos);
}

// Replicas' references can be byte for byte the same while the values they name are not: SameRecord tells.
TEST(ValuesFrom, SameReferenceBytesNeedTheSameTargets) {
  testing::TempDir dir;
  const pb::RunInfo run = SmallRun();
  auto write = [&](const std::string& name, uint32_t seed) {
    const std::string path = dir.File(name);
    auto w = TraceWriter::Open(path, run);
    EXPECT_TRUE(w.ok());
    pb::BucketRecord pre = Bucket(run, 0, 0, pb::PRE_REDUCE);
    const std::vector<float> v = testing::Floats(128, seed);
    *pre.mutable_slices(0) = MakeSlice(run.params(0), 0, 128, pb::FP32, v.data(), CaptureMode{});
    std::vector<WrittenFrame> written;
    EXPECT_TRUE((*w)->WriteBucket(pre, &written).ok());
    EXPECT_TRUE((*w)->WriteBucketValuesOf(Meta(0, 0, pb::FINAL, 0), written).ok());
    EXPECT_TRUE((*w)->Close().ok());
    auto r = TraceReader::Open(path);
    EXPECT_TRUE(r.ok());
    return std::move(r).value();
  };
  auto a = write("a.gtrace", 1), b = write("b.gtrace", 1), c = write("c.gtrace", 2);
  const uint64_t ref = a->index().entries(1).offset();
  const uint64_t from = a->index().entries(0).offset();
  TraceReader::StoredFrame sa, sb, sc;
  ASSERT_TRUE(a->ReadStoredAt(ref, &sa).ok());
  ASSERT_TRUE(b->ReadStoredAt(ref, &sb).ok());
  ASSERT_TRUE(c->ReadStoredAt(ref, &sc).ok());
  EXPECT_TRUE(sa.SameBytes(sc));  // the references alone look like copies
  EXPECT_TRUE(TraceReader::SameRecord(*a, sa, from, *b, sb));
  EXPECT_FALSE(TraceReader::SameRecord(*a, sa, from, *c, sc));
  // Frames that are not references: their bytes alone.
  TraceReader::StoredFrame ta, tb, tc;
  ASSERT_TRUE(a->ReadStoredAt(from, &ta).ok() && b->ReadStoredAt(from, &tb).ok() && c->ReadStoredAt(from, &tc).ok());
  EXPECT_TRUE(TraceReader::SameRecord(*a, ta, 0, *b, tb));
  EXPECT_FALSE(TraceReader::SameRecord(*a, ta, 0, *c, tc));
}

// Each rank lays its file out at offsets of its own, so replicas' references differ in values_from: they are the
// same record when that is all they differ in, their targets are byte for byte the same, and the copy's target is
// where its own reader would take it from.
TEST(ValuesFrom, ReferencesAtOtherOffsetsAreCopiesWhenTheirTargetsAre) {
  testing::TempDir dir;
  const pb::RunInfo run = SmallRun();
  const pb::BucketRecord pre = Bucket(run, 0, 0, pb::PRE_REDUCE);
  pb::BucketRecord other_values = pre;
  const std::vector<float> v = testing::Floats(static_cast<size_t>(run.params(0).numel()), 9);
  *other_values.mutable_slices(0) = MakeSlice(run.params(0), 0, run.params(0).numel(), pb::FP32, v.data(), {});
  const std::string step = testing::Step(0).SerializeAsString();
  struct Opened {
    std::unique_ptr<TraceReader> reader;
    TraceReader::StoredFrame ref;
    uint64_t from = 0;
  };
  int files = 0;
  // A file of a step frame, `pad` bucket records, the target, and a reference to it edited by `edit`.
  auto open = [&](int pad, const pb::BucketRecord& target, auto edit) {
    Crafted c;
    c.Add(format::FrameType::kStepInfo, step);
    for (int i = 0; i < pad; ++i)
      c.Add(format::FrameType::kBucketRecord, Bucket(run, 0, 1, pb::PRE_REDUCE).SerializeAsString());
    const uint64_t t = c.Add(format::FrameType::kBucketRecord, target.SerializeAsString());
    pb::BucketRecord ref = RefTo(target, t);
    edit(ref);
    const uint64_t at = c.Add(format::FrameType::kBucketRecord, ref.SerializeAsString());
    const std::string path = dir.File("rank-" + std::to_string(files++) + ".gtrace");
    testing::WriteBytes(path, c.bytes);
    Opened o;
    auto r = TraceReader::Open(path);
    EXPECT_TRUE(r.ok()) << r.status().message();
    o.reader = std::move(r).value();
    EXPECT_TRUE(o.reader->ReadStoredAt(at, &o.ref).ok());
    o.from = ref.values_from();
    return o;
  };
  auto same = [](pb::BucketRecord&) {};
  Opened a = open(0, pre, same);
  Opened moved = open(2, pre, same);
  ASSERT_NE(moved.from, a.from);
  EXPECT_FALSE(a.ref.SameBytes(moved.ref));
  EXPECT_TRUE(TraceReader::SameRecord(*a.reader, a.ref, a.from, *moved.reader, moved.ref));
  EXPECT_TRUE(TraceReader::SameRecord(*moved.reader, moved.ref, moved.from, *a.reader, a.ref));
  // Another field besides: another record.
  Opened divisor = open(2, pre, [](pb::BucketRecord& r) { r.set_divisor(4); });
  EXPECT_FALSE(TraceReader::SameRecord(*a.reader, a.ref, a.from, *divisor.reader, divisor.ref));
  // Other values at the target.
  Opened values = open(2, other_values, same);
  EXPECT_FALSE(TraceReader::SameRecord(*a.reader, a.ref, a.from, *values.reader, values.ref));
  // A copy whose target is a frame of the same bytes that its own reader would refuse to take values from: after
  // the reference. Its reader refuses the reference itself, so it is no copy.
  Crafted late;
  late.Add(format::FrameType::kStepInfo, step);
  const uint64_t at = late.bytes.size();
  pb::BucketRecord ref = RefTo(pre, at);  // the target's offset, its varint's length found by trying
  uint64_t target = 0;
  while (target != at + testing::PlainFrame(format::FrameType::kBucketRecord, ref.SerializeAsString()).size()) {
    target = at + testing::PlainFrame(format::FrameType::kBucketRecord, ref.SerializeAsString()).size();
    ref.set_values_from(target);
  }
  ASSERT_EQ(late.Add(format::FrameType::kBucketRecord, ref.SerializeAsString()), at);
  ASSERT_EQ(late.Add(format::FrameType::kBucketRecord, pre.SerializeAsString()), target);
  const std::string path = dir.File("late.gtrace");
  testing::WriteBytes(path, late.bytes);
  auto r = TraceReader::Open(path);
  ASSERT_TRUE(r.ok());
  TraceReader::StoredFrame late_ref, late_target, a_target;
  ASSERT_TRUE((*r)->ReadStoredAt(at, &late_ref).ok() && (*r)->ReadStoredAt(target, &late_target).ok());
  ASSERT_TRUE(a.reader->ReadStoredAt(a.from, &a_target).ok());
  EXPECT_TRUE(late_target.SameBytes(a_target));
  RecordView view;
  EXPECT_EQ((*r)->ReadView(at, &view).code(), Status::Code::kCorruption);
  EXPECT_FALSE(TraceReader::SameRecord(*a.reader, a.ref, a.from, **r, late_ref));
}

}  // namespace
}  // namespace gradtrace

namespace gradtrace {
namespace {

// Whole records as ReadEveryPath serializes a view's.
std::string Whole(const RecordView& view) {
  pb::BucketRecord whole = view.record();
  for (int i = 0; i < whole.slices_size(); ++i) {
    if (whole.slices(i).has_full()) whole.mutable_slices(i)->mutable_full()->set_data(std::string(view.data(i)));
  }
  return whole.SerializeAsString();
}

// A bucket's POST naming its PRE, read one after the other into one view (the diff's evidence does): the PRE the
// view holds is the target, not read and decoded again. Shown by spoiling the target on disk once it is held: the
// view still resolves the reference to the values it read, a fresh view (or another reader) reads the spoilt bytes.
TEST(ValuesFrom, AReferenceNamingTheFrameAViewHoldsTakesItsValuesThere) {
  testing::TempDir dir;
  const std::string path = dir.File("rank-00001.gtrace"), copy = dir.File("rank-00002.gtrace");
  const pb::RunInfo run = LargeRun();
  std::vector<WrittenFrame> written;
  {
    auto w = TraceWriter::Open(path, run);
    ASSERT_TRUE(w.ok()) << w.status().message();
    ASSERT_TRUE((*w)->WriteBucket(LargeRecord(run), &written).ok());
    ASSERT_GE(written.size(), 3u);
    ASSERT_TRUE((*w)->WriteBucketValuesOf(Meta(0, 0, pb::POST_REDUCE, 1), written).ok());
    ASSERT_TRUE((*w)->Close().ok());
  }
  testing::WriteBytes(copy, testing::ReadBytes(path));
  std::vector<std::pair<uint64_t, uint64_t>> refs;  // (reference, target)
  std::map<uint64_t, std::string> expected;         // reference -> its record, read by a fresh view
  auto r = TraceReader::Open(path);
  auto other = TraceReader::Open(copy);
  ASSERT_TRUE(r.ok() && other.ok());
  Frame f;
  while ((*r)->Next(&f)) {
    if (f.bucket && f.bucket->values_from() != 0) refs.emplace_back(f.offset, f.bucket->values_from());
  }
  ASSERT_EQ(refs.size(), written.size());
  for (auto [ref, target] : refs) {
    RecordView fresh;
    ASSERT_TRUE((*r)->ReadView(ref, &fresh).ok());
    expected[ref] = Whole(fresh);
  }
  // Held frames that are not what the reference names: read as any reference.
  RecordView view;
  ASSERT_TRUE((*r)->ReadView(refs[1].second, &view).ok());
  ASSERT_TRUE((*r)->ReadView(refs[0].first, &view).ok());
  EXPECT_EQ(Whole(view), expected[refs[0].first]);

  // Every target held, then spoilt in both files, then its reference read into the view holding it.
  std::string bytes = testing::ReadBytes(path);
  std::vector<RecordView> held(refs.size()), other_held(refs.size());
  for (size_t i = 0; i < refs.size(); ++i) {
    ASSERT_TRUE((*r)->ReadView(refs[i].second, &held[i]).ok());
    ASSERT_TRUE((*r)->ReadView(refs[i].second, &other_held[i]).ok());
    bytes[refs[i].second + format::kFrameHeaderSize + 100] ^= 0x5a;
  }
  testing::WriteBytes(path, bytes);
  testing::WriteBytes(copy, bytes);
  for (size_t i = 0; i < refs.size(); ++i) {
    SCOPED_TRACE("reference at " + std::to_string(refs[i].first));
    const Status st = (*r)->ReadView(refs[i].first, &held[i]);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(Whole(held[i]), expected[refs[i].first]);
    EXPECT_EQ(held[i].record().values_from(), refs[i].second);
    RecordView fresh;
    EXPECT_EQ((*r)->ReadView(refs[i].first, &fresh).code(), Status::Code::kCorruption);
    // The same frame held by this reader is not the other reader's: it reads its own (spoilt) target.
    EXPECT_EQ((*other)->ReadView(refs[i].first, &other_held[i]).code(), Status::Code::kCorruption);
  }
}

}  // namespace
}  // namespace gradtrace
