// Recorder: what it writes must read back byte-exact through the codec, in
// recording order, and write failures must follow --on-capture-error.
#include "recorder.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <optional>

#include "trace_reader.h"

namespace gradtrace::capture {
namespace {

pb::RunInfo TinyRun() {
  pb::RunInfo run;
  run.set_producer("recorder_test");
  run.set_run_id("r1");
  const char* names[] = {"embed.weight", "block0.attn.qkv.weight", "head.weight"};
  const int64_t numels[] = {64, 96, 40};
  for (int i = 0; i < 3; ++i) {
    pb::ParamInfo* p = run.add_params();
    p->set_id(i);
    p->set_name(names[i]);
    p->add_shape(numels[i]);
    p->set_numel(numels[i]);
    p->set_dtype(pb::FP32);
  }
  return run;
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "-" + std::to_string(getpid()) + ".gtrace")).string();
}

std::vector<pb::BucketRecord> ReadBuckets(const std::string& path) {
  auto reader = TraceReader::Open(path);
  EXPECT_TRUE(reader.ok()) << reader.status().message();
  std::vector<pb::BucketRecord> out;
  if (!reader.ok()) return out;
  Frame f;
  while ((*reader)->Next(&f)) {
    if (f.bucket) out.push_back(*f.bucket);
  }
  EXPECT_TRUE((*reader)->status().ok()) << (*reader)->status().message();
  return out;
}

TEST(Recorder, FullModeRoundTripIsByteExactAndOrdered) {
  const std::string path = TempPath("rec-full");
  RecorderOptions opt;
  opt.path = path;
  opt.writer_threads = 4;  // encoding in parallel must not reorder frames
  auto rec = Recorder::Open(opt, TinyRun());
  ASSERT_TRUE(rec.ok()) << rec.status().message();
  at::manual_seed(7);
  std::vector<at::Tensor> sent;
  for (int b = 0; b < 50; ++b) {
    BucketMeta meta;
    meta.step = 0;
    meta.bucket_id = b;
    meta.phase = (b % 2) ? pb::POST_REDUCE : pb::PRE_REDUCE;
    at::Tensor v = at::randn({32}, at::kFloat);
    sent.push_back(v.clone());
    ASSERT_TRUE((*rec)->RecordBucket(meta, {SliceRef{1, 16, v}}).ok());
    v.zero_();  // the recorder must have copied already
  }
  ASSERT_TRUE((*rec)->Close().ok());
  auto buckets = ReadBuckets(path);
  ASSERT_EQ(buckets.size(), 50u);
  for (int b = 0; b < 50; ++b) {
    EXPECT_EQ(buckets[b].bucket_id(), b);
    ASSERT_EQ(buckets[b].slices_size(), 1);
    const pb::Slice& s = buckets[b].slices(0);
    EXPECT_EQ(s.param_id(), 1);
    EXPECT_EQ(s.offset(), 16);
    EXPECT_EQ(s.count(), 32);
    auto bytes = DecodeFullBytes(s);
    ASSERT_TRUE(bytes.ok());
    ASSERT_EQ(bytes->size(), 32 * sizeof(float));
    EXPECT_EQ(std::memcmp(bytes->data(), sent[b].data_ptr(), bytes->size()), 0) << "bucket " << b;
  }
  std::remove(path.c_str());
}

// Format 1.6 (values_by_reference): a later phase whose values are byte for byte those last written in full for
// its bucket is written as a reference to those frames; anything else (one bit different, another layout, values
// that compress better than 16 to 1) in full. Read back, every record is the one written without references, byte
// for byte; with one writer thread or four.
TEST(Recorder, LaterPhasesWithTheSameBytesAreWrittenAsReferences) {
  struct Sent {
    BucketMeta meta;
    std::vector<SliceRef> slices;
  };
  // Parameter 1 made large enough for zeros to compress better than 16 to 1.
  constexpr int64_t kNumel = 6144;
  pb::RunInfo run = TinyRun();
  run.mutable_params(1)->set_shape(0, kNumel);
  run.mutable_params(1)->set_numel(kNumel);
  std::vector<Sent> sent;
  at::manual_seed(11);
  for (int64_t step = 0; step < 2; ++step) {
    for (int b = 0; b < 6; ++b) {
      BucketMeta meta;
      meta.step = step;
      meta.bucket_id = b;
      at::Tensor pre = b == 5 ? at::zeros({kNumel}) : at::randn({kNumel});
      at::Tensor post = pre.clone();
      if (b == 1) post.mul_(0.5);                                    // reduced: other values
      if (b == 2) static_cast<uint32_t*>(post.data_ptr())[7] ^= 1u;  // one bit
      meta.phase = pb::PRE_REDUCE;
      sent.push_back({meta, {SliceRef{1, 0, pre}}});
      meta.phase = pb::POST_REDUCE;
      meta.divisor = 1;
      if (b == 3) {
        sent.push_back({meta, {SliceRef{1, 0, post.narrow(0, 0, kNumel / 2)}}});  // a partition: another layout
      } else {
        sent.push_back({meta, {SliceRef{1, 0, post}}});
      }
      meta.phase = pb::FINAL;
      meta.divisor = 0;
      sent.push_back({meta, {SliceRef{1, 0, post}}});
    }
  }
  // Written as references: POST of buckets 0 and 4 (PRE's bytes) and FINAL of buckets 0, 1, 2 and 4 (the values
  // last written in full: PRE's or POST's); bucket 3's FINAL is not POST's layout, bucket 5's zeros compress too well.
  auto reference_from = [](const Sent& s) -> std::optional<pb::Phase> {
    const int b = s.meta.bucket_id;
    if (s.meta.phase == pb::POST_REDUCE && (b == 0 || b == 4)) return pb::PRE_REDUCE;
    if (s.meta.phase == pb::FINAL && (b == 0 || b == 4)) return pb::PRE_REDUCE;
    if (s.meta.phase == pb::FINAL && (b == 1 || b == 2)) return pb::POST_REDUCE;
    return std::nullopt;
  };
  auto write = [&](const std::string& name, bool references, int threads) {
    const std::string path = TempPath(name);
    RecorderOptions opt;
    opt.path = path;
    opt.values_by_reference = references;
    opt.writer_threads = threads;
    auto rec = Recorder::Open(opt, run);
    EXPECT_TRUE(rec.ok()) << rec.status().message();
    for (const Sent& s : sent) EXPECT_TRUE((*rec)->RecordBucket(s.meta, s.slices).ok());
    EXPECT_TRUE((*rec)->Close().ok());
    EXPECT_EQ((*rec)->stats().frames, sent.size());
    EXPECT_EQ((*rec)->stats().reference_records, references ? 12u : 0u);
    return path;
  };
  const std::string plain = write("rec-plain", false, 1);
  const std::vector<pb::BucketRecord> expected = ReadBuckets(plain);
  ASSERT_EQ(expected.size(), sent.size());
  for (const pb::BucketRecord& r : expected) EXPECT_EQ(r.values_from(), 0u);
  for (int threads : {1, 4}) {
    SCOPED_TRACE(threads);
    const std::string path = write("rec-refs-" + std::to_string(threads), true, threads);
    EXPECT_TRUE(VerifyFile(path).ok()) << VerifyFile(path).message();
    auto reader = TraceReader::Open(path);
    ASSERT_TRUE(reader.ok());
    const auto& entries = (*reader)->index().entries();
    std::vector<pb::BucketRecord> got = ReadBuckets(path);
    ASSERT_EQ(got.size(), sent.size());
    for (size_t i = 0; i < got.size(); ++i) {
      SCOPED_TRACE(i);
      const std::optional<pb::Phase> from = reference_from(sent[i]);
      ASSERT_EQ(got[i].values_from() != 0, from.has_value());
      if (from) {  // the frame of this bucket's `from` phase
        size_t target = i;
        while (target > 0 && !(got[--target].phase() == *from && got[target].bucket_id() == got[i].bucket_id())) {
        }
        EXPECT_EQ(got[i].values_from(), entries[static_cast<int>(target)].offset());
      }
      got[i].clear_values_from();
      EXPECT_EQ(got[i].SerializeAsString(), expected[i].SerializeAsString());
    }
    EXPECT_LT(std::filesystem::file_size(path), std::filesystem::file_size(plain));
    std::remove(path.c_str());
  }
  std::remove(plain.c_str());
}

TEST(Recorder, Bf16AndFp64KeepTheirDtype) {
  const std::string path = TempPath("rec-dtype");
  RecorderOptions opt;
  opt.path = path;
  auto rec = Recorder::Open(opt, TinyRun());
  ASSERT_TRUE(rec.ok());
  at::Tensor bf = at::arange(40, at::kFloat).to(at::kBFloat16);
  at::Tensor f64 = at::arange(64, at::kDouble) / 3.0;
  ASSERT_TRUE((*rec)->RecordBucket(BucketMeta{}, {SliceRef{2, 0, bf}, SliceRef{0, 0, f64}}).ok());
  ASSERT_TRUE((*rec)->Close().ok());
  auto buckets = ReadBuckets(path);
  ASSERT_EQ(buckets.size(), 1u);
  ASSERT_EQ(buckets[0].slices_size(), 2);
  EXPECT_EQ(buckets[0].slices(0).dtype(), pb::BF16);
  EXPECT_EQ(buckets[0].slices(1).dtype(), pb::FP64);
  auto v = DecodeFullValues(buckets[0].slices(1));
  ASSERT_TRUE(v.ok());
  for (int i = 0; i < 64; ++i) EXPECT_EQ((*v)[i], i / 3.0);
  std::remove(path.c_str());
}

TEST(Recorder, StepAndParamSelection) {
  const std::string path = TempPath("rec-select");
  RecorderOptions opt;
  opt.path = path;
  opt.steps = std::set<int64_t>{1};
  opt.param_regex = "attn|head";
  auto rec = Recorder::Open(opt, TinyRun());
  ASSERT_TRUE(rec.ok());
  EXPECT_FALSE((*rec)->WantsParam(0));
  EXPECT_TRUE((*rec)->WantsParam(1));
  EXPECT_TRUE((*rec)->WantsParam(2));
  EXPECT_FALSE((*rec)->WantsParam(3));
  for (int64_t step = 0; step < 3; ++step) {
    BucketMeta meta;
    meta.step = step;
    std::vector<SliceRef> s = {SliceRef{0, 0, at::ones({64})}, SliceRef{1, 0, at::ones({96})},
                               SliceRef{2, 0, at::ones({40})}};
    ASSERT_TRUE((*rec)->RecordBucket(meta, s).ok());
  }
  ASSERT_TRUE((*rec)->Close().ok());
  auto buckets = ReadBuckets(path);
  ASSERT_EQ(buckets.size(), 1u);
  EXPECT_EQ(buckets[0].step(), 1);
  ASSERT_EQ(buckets[0].slices_size(), 2);
  EXPECT_EQ(buckets[0].slices(0).param_id(), 1);
  EXPECT_EQ(buckets[0].slices(1).param_id(), 2);
  std::remove(path.c_str());
}

TEST(Recorder, SliceOutsideParameterIsRefused) {
  const std::string path = TempPath("rec-range");
  RecorderOptions opt;
  opt.path = path;
  auto rec = Recorder::Open(opt, TinyRun());
  ASSERT_TRUE(rec.ok());
  Status st = (*rec)->RecordBucket(BucketMeta{}, {SliceRef{2, 30, at::ones({20})}});
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("head.weight"), std::string::npos) << st.message();
  std::remove(path.c_str());
}

TEST(Recorder, BackPressureBoundsTheQueueAndLosesNothing) {
  const std::string path = TempPath("rec-bp");
  RecorderOptions opt;
  opt.path = path;
  opt.max_queue_bytes = 1024;  // smaller than 3 jobs: the producer must wait
  auto rec = Recorder::Open(opt, TinyRun());
  ASSERT_TRUE(rec.ok());
  for (int b = 0; b < 200; ++b) {
    BucketMeta meta;
    meta.bucket_id = b;
    ASSERT_TRUE((*rec)->RecordBucket(meta, {SliceRef{1, 0, at::full({96}, float(b))}}).ok());
  }
  ASSERT_TRUE((*rec)->Close().ok());
  EXPECT_EQ((*rec)->stats().frames, 200u);
  auto buckets = ReadBuckets(path);
  ASSERT_EQ(buckets.size(), 200u);
  auto last = DecodeFullValues(buckets[199].slices(0));
  ASSERT_TRUE(last.ok());
  EXPECT_EQ((*last)[95], 199.0);
  std::remove(path.c_str());
}

TEST(Recorder, MalformedRunInfoIsRefusedEvenUnderDisable) {
  pb::RunInfo run = TinyRun();
  run.mutable_params(1)->set_id(7);
  RecorderOptions opt;
  opt.path = TempPath("rec-bad-run");
  opt.on_error = OnCaptureError::kDisable;
  auto rec = Recorder::Open(opt, run);
  ASSERT_FALSE(rec.ok());
  EXPECT_EQ(rec.status().code(), Status::Code::kInvalidArgument) << rec.status().message();
  std::remove(opt.path.c_str());
}

TEST(Recorder, UnwritableDirectoryAbortNamesThePath) {
  RecorderOptions opt;
  opt.path = "/nonexistent-dir/rank-00000.gtrace";
  opt.on_error = OnCaptureError::kAbort;
  auto rec = Recorder::Open(opt, TinyRun());
  ASSERT_FALSE(rec.ok());
  EXPECT_NE(rec.status().message().find("/nonexistent-dir/rank-00000.gtrace"), std::string::npos)
      << rec.status().message();
}

TEST(Recorder, UnwritableDirectoryDisableKeepsTrainingGoing) {
  RecorderOptions opt;
  opt.path = "/nonexistent-dir/rank-00000.gtrace";
  opt.on_error = OnCaptureError::kDisable;
  auto rec = Recorder::Open(opt, TinyRun());
  ASSERT_TRUE(rec.ok());
  EXPECT_FALSE((*rec)->enabled());
  EXPECT_TRUE((*rec)->RecordBucket(BucketMeta{}, {SliceRef{0, 0, at::ones({64})}}).ok());
  EXPECT_TRUE((*rec)->Close().ok());
}

// /dev/full accepts open() and fails every write with ENOSPC: a full disk.
TEST(Recorder, DiskFullAbortSurfacesTheError) {
  RecorderOptions opt;
  opt.path = "/dev/full";
  opt.on_error = OnCaptureError::kAbort;
  auto rec = Recorder::Open(opt, TinyRun());
  if (!rec.ok()) {  // the header write itself may already fail
    EXPECT_NE(rec.status().message().find("/dev/full"), std::string::npos) << rec.status().message();
    return;
  }
  Status st;
  for (int b = 0; b < 100 && st.ok(); ++b) st = (*rec)->RecordBucket(BucketMeta{}, {SliceRef{0, 0, at::ones({64})}});
  if (st.ok()) st = (*rec)->Close();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("/dev/full"), std::string::npos) << st.message();
}

TEST(Recorder, DiskFullDisableStopsCaptureOnly) {
  RecorderOptions opt;
  opt.path = "/dev/full";
  opt.on_error = OnCaptureError::kDisable;
  auto rec = Recorder::Open(opt, TinyRun());
  ASSERT_TRUE(rec.ok());
  for (int b = 0; b < 100; ++b) {
    EXPECT_TRUE((*rec)->RecordBucket(BucketMeta{}, {SliceRef{0, 0, at::ones({64})}}).ok());
  }
  EXPECT_TRUE((*rec)->Close().ok());
  EXPECT_FALSE((*rec)->enabled());
}

// Issue 20: capture never takes training down by default.
TEST(Recorder, DefaultOnErrorIsDisable) { EXPECT_EQ(RecorderOptions{}.on_error, OnCaptureError::kDisable); }

// A file-size limit (EFBIG, as a full disk's ENOSPC) in the middle of a frame: capture stops, and the file
// ends at the last complete frame, so it reads back as truncated with every frame written before it.
TEST(Recorder, WriteErrorDisablesAndLeavesATruncatedTraceAtAFrameBoundary) {
  const std::string path = TempPath("rec-fsize");
  std::remove(path.c_str());
  RecorderOptions opt;
  opt.path = path;
  auto rec = Recorder::Open(opt, TinyRun());
  ASSERT_TRUE(rec.ok()) << rec.status().message();
  struct rlimit old_limit;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old_limit;
  small.rlim_cur = 20000;  // a few frames of 96 random floats (they do not compress)
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  at::manual_seed(3);
  for (int b = 0; b < 200; ++b) {
    BucketMeta meta;
    meta.bucket_id = b;
    EXPECT_TRUE((*rec)->RecordBucket(meta, {SliceRef{1, 0, at::randn({96})}}).ok());
  }
  EXPECT_TRUE((*rec)->Close().ok());
  setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_FALSE((*rec)->enabled());
  const uint64_t frames = (*rec)->stats().frames;
  EXPECT_GT(frames, 3u);
  EXPECT_LT(frames, 200u);

  auto reader = TraceReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status().message();
  Frame f;
  uint64_t buckets = 0;
  while ((*reader)->Next(&f)) buckets += f.bucket ? 1 : 0;
  EXPECT_EQ(buckets, frames);
  EXPECT_EQ((*reader)->status().code(), Status::Code::kTruncated) << (*reader)->status().message();
  EXPECT_NE((*reader)->status().message().find("the writer did not finish"), std::string::npos)
      << (*reader)->status().message();
  EXPECT_EQ((*reader)->stop_offset(), std::filesystem::file_size(path));  // no partial frame after the last one
  EXPECT_LE(std::filesystem::file_size(path), 20000u);
  EXPECT_EQ(VerifyFile(path).code(), Status::Code::kTruncated);
  std::remove(path.c_str());
}

// A trace already at the path is not a write error: refused at Open under kDisable too, naming the file and
// the way out; replaced with overwrite; never while another writer holds it, overwrite or not.
TEST(Recorder, ExistingTraceIsRefusedUnlessOverwriteAndNeverWhileWritten) {
  const std::string path = TempPath("rec-exists");
  std::remove(path.c_str());
  RecorderOptions opt;
  opt.path = path;
  {
    auto first = Recorder::Open(opt, TinyRun());
    ASSERT_TRUE(first.ok()) << first.status().message();
    pb::RunInfo second = TinyRun();
    second.set_run_id("r2");
    for (bool overwrite : {false, true}) {
      RecorderOptions o = opt;
      o.overwrite = overwrite;
      auto live = Recorder::Open(o, second);
      ASSERT_FALSE(live.ok());
      EXPECT_EQ(live.status().message(),
                path + ": exists: another run is writing here now (run 'r1' of recorder_test)");
    }
    ASSERT_TRUE((*first)->Close().ok());
  }
  pb::RunInfo second = TinyRun();
  second.set_run_id("r2");
  auto again = Recorder::Open(opt, second);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().message(), path +
                                          ": exists (run 'r1' of recorder_test): not replaced without overwrite "
                                          "(gradtrace-train --overwrite, overwrite=True in Python); or write to a "
                                          "new directory");
  opt.overwrite = true;
  auto replaced = Recorder::Open(opt, second);
  ASSERT_TRUE(replaced.ok()) << replaced.status().message();
  EXPECT_TRUE((*replaced)->enabled());
  ASSERT_TRUE((*replaced)->Close().ok());
  auto reader = TraceReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status().message();
  EXPECT_EQ((*reader)->run_info().run_id(), "r2");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace gradtrace::capture
