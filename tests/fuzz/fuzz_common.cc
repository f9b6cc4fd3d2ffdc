#include "fuzz_common.h"

#include <google/protobuf/stubs/logging.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <vector>

#include "crc32c.h"
#include "format.h"
#include "frame_io.h"
#include "trace_writer.h"

namespace gradtrace::fuzz {
namespace {

// protobuf logs every invalid UTF-8 string it refuses; the fuzzer makes many.
const bool kQuietProtobuf = [] {
  google::protobuf::SetLogHandler(nullptr);
  return true;
}();

}  // namespace

pb::RunInfo FuzzRun() {
  pb::RunInfo run;
  run.set_producer("gradtrace-fuzz");
  run.set_producer_version("0.1.0");
  run.set_run_id("fuzz-1");
  run.mutable_config()->set_world(2);
  run.mutable_config()->set_dp(2);
  run.mutable_config()->set_sp(1);
  (*run.mutable_config()->mutable_extra())["zero"] = "1";
  pb::ProcessGroup* g = run.add_groups();
  g->set_name("dp");
  g->add_ranks(0);
  g->add_ranks(1);
  struct P {
    const char* name;
    std::vector<int64_t> shape;
    pb::DType dtype;
  };
  const P params[] = {
      {"embed.weight", {16, 8}, pb::FP32}, {"layer.0.bias", {8}, pb::BF16}, {"layer.0.norm", {5}, pb::FP16},
      {"head", {3, 3}, pb::FP64},          {"scale", {}, pb::FP32},         {"empty", {0}, pb::FP32}};
  for (const P& p : params) {
    pb::ParamInfo* out = run.add_params();
    out->set_id(run.params_size() - 1);
    out->set_name(p.name);
    int64_t n = 1;
    for (int64_t d : p.shape) {
      out->add_shape(d);
      n *= d;
    }
    out->set_numel(n);
    out->set_dtype(p.dtype);
  }
  run.set_model_fingerprint(ModelFingerprint(run));
  return run;
}

namespace {

// Deterministic element bytes, with a NaN and an Inf among them.
std::string Elements(int64_t n, pb::DType dtype, uint32_t seed) {
  const size_t w = DTypeSize(dtype);
  std::string out(static_cast<size_t>(n) * w, '\0');
  for (int64_t i = 0; i < n; ++i) {
    double v = static_cast<double>((i * 37 + seed * 11) % 97) * 1e-3 - 0.05;
    if (i == 3) v = std::numeric_limits<double>::infinity();
    if (i == 5) v = std::numeric_limits<double>::quiet_NaN();
    DoubleToElement(dtype, v, reinterpret_cast<uint8_t*>(out.data()) + i * w);
  }
  return out;
}

}  // namespace

Status WriteSampleTrace(const std::string& path, const CaptureMode& mode, bool index, int rank) {
  pb::RunInfo run = FuzzRun();
  run.set_rank(rank);
  run.set_dp_rank(rank);
  WriterOptions options;
  options.write_index = index;
  options.overwrite = true;  // seeds are rewritten on purpose: one memfd per process, the corpus on every run
  auto w = TraceWriter::Open(path, run, options);
  if (!w.ok()) return w.status();
  for (int step = 0; step < 2; ++step) {
    pb::StepInfo s;
    s.set_step(step);
    s.set_loss(2.5 - step);
    s.set_valid_tokens(100 + step);
    s.set_lr(1e-3);
    GT_RETURN_IF_ERROR((*w)->WriteStep(s));
    int bucket = 0;
    std::vector<WrittenFrame> pre;  // full mode: POST_REDUCE holds PRE's values, written by reference (1.6)
    for (pb::Phase phase : {pb::PRE_REDUCE, pb::POST_REDUCE, pb::FINAL}) {
      pb::BucketRecord r;
      r.set_step(step);
      r.set_bucket_id(bucket++);
      r.set_phase(phase);
      r.set_group(phase == pb::FINAL ? "" : "dp");
      r.set_divisor(phase == pb::POST_REDUCE ? 2.0 : 0.0);
      for (const pb::ParamInfo& p : run.params()) {
        const std::string data = Elements(p.numel(), p.dtype(), static_cast<uint32_t>(step * 10 + p.id()));
        if (p.id() == 0) {  // two slices of one parameter, as a ZeRO partition cuts it
          const int64_t half = p.numel() / 2;
          const size_t w = DTypeSize(p.dtype());
          *r.add_slices() = MakeSlice(p, 0, half, p.dtype(), data.data(), mode);
          *r.add_slices() = MakeSlice(p, half, p.numel() - half, p.dtype(), data.data() + half * w, mode);
        } else {
          *r.add_slices() = MakeSlice(p, 0, p.numel(), p.dtype(), data.data(), mode);
        }
      }
      if (phase == pb::POST_REDUCE && !pre.empty()) {
        r.clear_slices();
        GT_RETURN_IF_ERROR((*w)->WriteBucketValuesOf(r, pre));
      } else {
        GT_RETURN_IF_ERROR(
            (*w)->WriteBucket(r, phase == pb::PRE_REDUCE && mode.kind == CaptureMode::Kind::kFull ? &pre : nullptr));
      }
    }
  }
  if (index) return (*w)->Close();
  return Status::Ok();  // the destructor closes without index and footer
}

const std::string& SampleTracePrefix() {
  static const std::string* prefix = [] {
    MemFile f;
    CaptureMode stats;
    stats.kind = CaptureMode::Kind::kStats;
    if (!WriteSampleTrace(f.path(), stats, true).ok()) Fail("cannot write the sample trace");
    std::ifstream in(f.path(), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    const uint64_t index_offset =
        frame_io::GetU64(reinterpret_cast<const uint8_t*>(bytes.data()) + bytes.size() - format::kFooterSize);
    return new std::string(bytes.substr(0, index_offset));
  }();
  return *prefix;
}

MemFile::MemFile() {
  fd_ = memfd_create("gradtrace-fuzz", 0);
  if (fd_ < 0) Fail("memfd_create failed");
  path_ = "/proc/self/fd/" + std::to_string(fd_);
}

MemFile::~MemFile() { close(fd_); }

void MemFile::Set(const uint8_t* data, size_t size) {
  if (ftruncate(fd_, 0) != 0 || pwrite(fd_, data, size, 0) != static_cast<ssize_t>(size)) Fail("memfd write failed");
}

std::string PlainFrame(uint8_t type, const std::string& payload) {
  frame_io::FrameHeader h;
  h.stored_len = h.raw_len = static_cast<uint32_t>(payload.size());
  h.type = type;
  uint8_t hdr[format::kFrameHeaderSize];
  h.Encode(hdr);
  const uint32_t crc =
      crc32c::Extend(crc32c::Value(hdr + frame_io::kCrcCoveredHeaderOffset, 4), payload.data(), payload.size());
  frame_io::PutU32(hdr + 8, crc32c::Mask(crc));
  return std::string(reinterpret_cast<const char*>(hdr), sizeof hdr) + payload;
}

std::string Footer(uint64_t index_offset) {
  uint8_t f[format::kFooterSize];
  frame_io::PutU64(f, index_offset);
  std::memcpy(f + 8, format::kFooterMagic, 8);
  return std::string(reinterpret_cast<const char*>(f), sizeof f);
}

void Fail(const std::string& what) {
  std::fprintf(stderr, "gradtrace-fuzz: invariant broken: %s\n", what.c_str());
  std::abort();
}

void CheckOneLine(const Status& s) {
  if (s.message().find_first_of("\n\r") != std::string::npos) Fail("error message spans lines: " + s.message());
}

void CheckErrorNaming(const Status& s, const std::string& needle) {
  if (s.ok()) return;
  CheckOneLine(s);
  if (s.message().find(needle) == std::string::npos) Fail("error message does not name " + needle + ": " + s.message());
}

void CheckErrorLine(const Status& s, const std::string& path) {
  if (s.ok()) return;
  const std::string& m = s.message();
  CheckOneLine(s);
  if (m.rfind(path + ": ", 0) != 0) Fail("error message does not start with the path: " + m);
  if (s.code() != Status::Code::kIoError && m.rfind(path + ": offset ", 0) != 0) {
    Fail("error message names no offset: " + m);
  }
}

}  // namespace gradtrace::fuzz
