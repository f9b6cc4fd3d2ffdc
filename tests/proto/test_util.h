// Helpers shared by the codec tests: a small model, a small trace written to a
// temporary directory, raw file edits, and reading back every frame.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "format.h"
#include "gradtrace.pb.h"
#include "slice_codec.h"
#include "trace_reader.h"
#include "trace_writer.h"

namespace gradtrace::testing {

// A fresh directory per test, removed afterwards. In memory (/dev/shm) where
// there is one: the sweeps rewrite a file thousands of times.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::error_code ec;
    const std::filesystem::path base =
        std::filesystem::is_directory("/dev/shm", ec) ? "/dev/shm" : std::filesystem::temp_directory_path();
    path_ = base / ("gradtrace-" + std::string(info->test_suite_name()) + "-" + info->name() + "-" +
                    std::to_string(std::random_device{}()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string File(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline pb::ParamInfo Param(int id, const std::string& name, std::vector<int64_t> shape, pb::DType dtype = pb::FP32) {
  pb::ParamInfo p;
  p.set_id(id);
  p.set_name(name);
  int64_t n = 1;
  for (int64_t d : shape) {
    p.add_shape(d);
    n *= d;
  }
  p.set_numel(n);
  p.set_dtype(dtype);
  return p;
}

inline pb::RunInfo SmallRun() {
  pb::RunInfo run;
  run.set_producer("gradtrace-test");
  run.set_producer_version("0.1.0");
  run.set_run_id("run-1");
  run.mutable_config()->set_world(4);
  run.mutable_config()->set_dp(2);
  run.mutable_config()->set_sp(2);
  run.mutable_config()->set_capture_mode("full");
  run.set_rank(1);
  run.set_dp_rank(0);
  run.set_sp_rank(1);
  run.set_host("localhost");
  pb::ProcessGroup* g = run.add_groups();
  g->set_name("sp");
  g->add_ranks(0);
  g->add_ranks(1);
  *run.add_params() = Param(0, "embed.weight", {16, 8});
  *run.add_params() = Param(1, "layer.0.bias", {8}, pb::BF16);
  return run;
}

// Deterministic fp32 values; different seeds give different values.
inline std::vector<float> Floats(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1e-3f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

inline pb::BucketRecord Bucket(const pb::RunInfo& run, int64_t step, int bucket, pb::Phase phase) {
  pb::BucketRecord r;
  r.set_step(step);
  r.set_bucket_id(bucket);
  r.set_phase(phase);
  r.set_group("sp");
  const pb::ParamInfo& p = run.params(0);
  std::vector<float> v = Floats(static_cast<size_t>(p.numel()), static_cast<uint32_t>(step * 10 + bucket));
  *r.add_slices() = MakeSlice(p, 0, p.numel(), pb::FP32, v.data(), CaptureMode{});
  return r;
}

inline pb::StepInfo Step(int64_t step) {
  pb::StepInfo s;
  s.set_step(step);
  s.set_loss(2.5 + step);
  s.set_valid_tokens(100 + step);
  return s;
}

// Writes a small trace: per step a StepInfo and two bucket records. Returns
// the messages written, in order, serialized (the expected frame contents).
inline std::vector<std::string> WriteSmallTrace(const std::string& path, int steps = 2, WriterOptions options = {}) {
  const pb::RunInfo run = SmallRun();
  auto w = TraceWriter::Open(path, run, options);
  EXPECT_TRUE(w.ok()) << w.status().message();
  std::vector<std::string> written;
  for (int s = 0; s < steps; ++s) {
    pb::StepInfo st = Step(s);
    EXPECT_TRUE((*w)->WriteStep(st).ok());
    written.push_back(st.SerializeAsString());
    for (int b = 0; b < 2; ++b) {
      pb::BucketRecord r = Bucket(run, s, b, b == 0 ? pb::PRE_REDUCE : pb::POST_REDUCE);
      EXPECT_TRUE((*w)->WriteBucket(r).ok());
      written.push_back(r.SerializeAsString());
    }
  }
  EXPECT_TRUE((*w)->Close().ok());
  return written;
}

inline std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

struct ReadResult {
  bool opened = false;
  Status status;                      // Open's status, or the reader's final status
  std::vector<std::string> messages;  // serialized StepInfo/BucketRecord, in order
  std::vector<uint64_t> offsets;
  uint64_t stop_offset = 0;
};

inline ReadResult ReadAll(const std::string& path, ReadOptions options = {}) {
  ReadResult out;
  auto r = TraceReader::Open(path, options);
  if (!r.ok()) {
    out.status = r.status();
    return out;
  }
  out.opened = true;
  Frame f;
  while ((*r)->Next(&f)) {
    out.offsets.push_back(f.offset);
    if (f.step) out.messages.push_back(f.step->SerializeAsString());
    if (f.bucket) out.messages.push_back(f.bucket->SerializeAsString());
  }
  out.status = (*r)->status();
  out.stop_offset = (*r)->stop_offset();
  return out;
}

// Offsets where each frame ends (RunInfo, data frames, index frames), from a
// clean read of the file's frame headers.
inline std::vector<uint64_t> FrameEnds(const std::string& bytes) {
  std::vector<uint64_t> ends;
  uint64_t off = format::kFileHeaderSize;
  const uint64_t end = bytes.size() - format::kFooterSize;
  while (off + format::kFrameHeaderSize <= end) {
    uint32_t stored;
    std::memcpy(&stored, bytes.data() + off, 4);
    off += format::kFrameHeaderSize + stored;
    ends.push_back(off);
  }
  return ends;
}

}  // namespace gradtrace::testing

#include "crc32c.h"
#include "frame_io.h"

namespace gradtrace::testing {

// A frame with a correct checksum over whatever header fields are given.
inline std::string EncodeFrame(uint8_t type, uint8_t codec, const std::string& stored, uint32_t raw_len,
                               uint16_t reserved = 0) {
  frame_io::FrameHeader h;
  h.stored_len = static_cast<uint32_t>(stored.size());
  h.raw_len = raw_len;
  h.type = type;
  h.codec = codec;
  h.reserved = reserved;
  uint8_t hdr[format::kFrameHeaderSize];
  h.Encode(hdr);
  uint32_t crc = crc32c::Value(hdr + 12, 4);
  crc = crc32c::Extend(crc, stored.data(), stored.size());
  frame_io::PutU32(hdr + 8, crc32c::Mask(crc));
  return std::string(reinterpret_cast<const char*>(hdr), sizeof hdr) + stored;
}

inline std::string PlainFrame(format::FrameType type, const std::string& payload) {
  return EncodeFrame(static_cast<uint8_t>(type), 0, payload, static_cast<uint32_t>(payload.size()));
}

inline std::string FileHeader(uint16_t major = format::kMajorVersion, uint16_t minor = format::kMinorVersion,
                              uint32_t flags = 0) {
  uint8_t h[format::kFileHeaderSize];
  std::memcpy(h, format::kFileMagic, 8);
  frame_io::PutU16(h + 8, major);
  frame_io::PutU16(h + 10, minor);
  frame_io::PutU32(h + 12, flags);
  return std::string(reinterpret_cast<const char*>(h), sizeof h);
}

// Header + the small RunInfo, no index: append frames to it.
inline std::string CraftedPrefix() {
  pb::RunInfo run = SmallRun();
  run.set_model_fingerprint(ModelFingerprint(run));
  return FileHeader() + PlainFrame(format::FrameType::kRunInfo, run.SerializeAsString());
}

}  // namespace gradtrace::testing
