// gradtrace-pytest-writer: the C++ side of the Python binding's tests.
//
//   gradtrace-pytest-writer write PATH   writes the known trace described below
//   gradtrace-pytest-writer dump PATH    reads any trace with the C++ reader and
//                                        prints it as canonical JSON lines
//
// The known trace (tests/python/known_trace.py mirrors it and must change with it):
//   params   0 "layer.w" [4, 8] FP32 · 1 "layer.b" [16] FP16 · 2 "emb" [5, 3] BF16 · 3 "head.x" [7] FP64
//   value    v(param, i, step) = (((7 i + 3 param + 5 step) mod 23) - 11) / 8, exact in every dtype
//   steps 0 and 1, each: StepInfo {loss 2.5 / (step + 1), valid_tokens 100 + step, lr 1e-3}, then
//     bucket 0 PRE_REDUCE  group "sdp": every parameter full
//     bucket 1 POST_REDUCE group "sdp": param 0 elements [8, 24) full, partition 8/16 of 32, divisor 2
//     bucket 2 FINAL: every parameter as sketch:5, then every parameter as stats
//
// Dump format, one JSON object per line: {"run": ...}, then per frame the
// record's fields, floating-point values as the hex of their little-endian
// IEEE bytes (exact, and easy to produce in Python), full payloads as the hex
// of their raw element bytes; last {"end": status code, "message", "stop_offset"}.
#include <bit>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "slice_codec.h"
#include "trace_reader.h"
#include "trace_writer.h"

namespace gradtrace {
namespace {

double KnownValue(int param, int64_t i, int64_t step) {
  return static_cast<double>(((7 * i + 3 * param + 5 * step) % 23) - 11) / 8.0;
}

pb::RunInfo KnownRunInfo() {
  pb::RunInfo run;
  run.set_producer("gradtrace-pytest-writer");
  run.set_producer_version("1");
  run.set_run_id("pytest-known");
  run.set_host("localhost");
  pb::Config* c = run.mutable_config();
  c->set_world(1);
  c->set_dp(1);
  c->set_sp(1);
  c->set_seed(12345678901234ull);
  c->set_capture_mode("full");
  c->set_reduce_bucket_size(int64_t{1} << 40);
  (*c->mutable_extra())["note"] = "known trace";
  struct P {
    const char* name;
    std::vector<int64_t> shape;
    pb::DType dtype;
  };
  const P params[] = {
      {"layer.w", {4, 8}, pb::FP32}, {"layer.b", {16}, pb::FP16}, {"emb", {5, 3}, pb::BF16}, {"head.x", {7}, pb::FP64}};
  for (const P& p : params) {
    pb::ParamInfo* info = run.add_params();
    info->set_id(run.params_size() - 1);
    info->set_name(p.name);
    int64_t numel = 1;
    for (int64_t d : p.shape) {
      info->add_shape(d);
      numel *= d;
    }
    info->set_numel(numel);
    info->set_dtype(p.dtype);
  }
  run.set_model_fingerprint(ModelFingerprint(run));
  return run;
}

pb::Slice KnownSlice(const pb::ParamInfo& p, int64_t offset, int64_t count, int64_t step, const CaptureMode& mode) {
  const size_t w = DTypeSize(p.dtype());
  std::vector<uint8_t> bytes(static_cast<size_t>(count) * w);
  for (int64_t i = 0; i < count; ++i) DoubleToElement(p.dtype(), KnownValue(p.id(), offset + i, step), &bytes[i * w]);
  return MakeSlice(p, offset, count, p.dtype(), bytes.data(), mode);
}

int Write(const std::string& path) {
  const pb::RunInfo run = KnownRunInfo();
  Expected<std::unique_ptr<TraceWriter>> w = TraceWriter::Open(path, run);
  if (!w.ok()) {
    std::fprintf(stderr, "%s\n", w.status().message().c_str());
    return 2;
  }
  TraceWriter& writer = **w;
  const CaptureMode full;
  CaptureMode sketch;
  sketch.kind = CaptureMode::Kind::kSketch;
  sketch.k = 5;
  CaptureMode stats;
  stats.kind = CaptureMode::Kind::kStats;
  Status st;
  for (int64_t step = 0; step < 2 && st.ok(); ++step) {
    pb::StepInfo info;
    info.set_step(step);
    info.set_loss(2.5 / static_cast<double>(step + 1));
    info.set_valid_tokens(100 + step);
    info.set_lr(1e-3);
    st = writer.WriteStep(info);

    pb::BucketRecord pre;
    pre.set_step(step);
    pre.set_bucket_id(0);
    pre.set_phase(pb::PRE_REDUCE);
    pre.set_group("sdp");
    for (const pb::ParamInfo& p : run.params()) *pre.add_slices() = KnownSlice(p, 0, p.numel(), step, full);
    if (st.ok()) st = writer.WriteBucket(pre);

    pb::BucketRecord post;
    post.set_step(step);
    post.set_bucket_id(1);
    post.set_phase(pb::POST_REDUCE);
    post.set_group("sdp");
    post.set_bucket_numel(32);
    post.set_partition_offset(8);
    post.set_partition_count(16);
    post.set_divisor(2.0);
    *post.add_slices() = KnownSlice(run.params(0), 8, 16, step, full);
    if (st.ok()) st = writer.WriteBucket(post);

    pb::BucketRecord fin;
    fin.set_step(step);
    fin.set_bucket_id(2);
    fin.set_phase(pb::FINAL);
    for (const pb::ParamInfo& p : run.params()) *fin.add_slices() = KnownSlice(p, 0, p.numel(), step, sketch);
    for (const pb::ParamInfo& p : run.params()) *fin.add_slices() = KnownSlice(p, 0, p.numel(), step, stats);
    if (st.ok()) st = writer.WriteBucket(fin);
  }
  if (st.ok()) st = writer.Close();
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.message().c_str());
    return 2;
  }
  return 0;
}

std::string Hex(const void* data, size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  const auto* p = static_cast<const uint8_t*>(data);
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    out += kHex[p[i] >> 4];
    out += kHex[p[i] & 0xf];
  }
  return out;
}

std::string HexDouble(double v) { return '"' + Hex(&v, sizeof v) + '"'; }

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + '"';
}

std::string SliceJson(const pb::Slice& s) {
  std::string out = "{\"param_id\":" + std::to_string(s.param_id()) + ",\"offset\":" + std::to_string(s.offset()) +
                    ",\"count\":" + std::to_string(s.count()) + ",\"dtype\":" + Quote(pb::DType_Name(s.dtype()));
  if (s.has_full()) {
    Expected<std::string> bytes = DecodeFullBytes(s);
    out += ",\"mode\":\"full\",\"data\":" + (bytes.ok() ? Quote(Hex(bytes->data(), bytes->size())) : "null");
  } else if (s.has_sketch()) {
    out += ",\"mode\":\"sketch\",\"k\":" + std::to_string(s.sketch().k()) + ",\"positions\":[";
    for (int i = 0; i < s.sketch().positions_size(); ++i) {
      out += (i ? "," : "") + std::to_string(s.sketch().positions(i));
    }
    const auto& v = s.sketch().values();
    out += "],\"values\":" + Quote(Hex(v.data(), sizeof(double) * v.size()));
  } else if (s.has_stats()) {
    const pb::StatsPayload& st = s.stats();
    out += ",\"mode\":\"stats\",\"stats\":{\"count\":" + std::to_string(st.count()) +
           ",\"sum\":" + HexDouble(st.sum()) + ",\"sum_sq\":" + HexDouble(st.sum_sq()) +
           ",\"abs_max\":" + HexDouble(st.abs_max()) + ",\"nonfinite\":" + std::to_string(st.nonfinite()) + "}";
  }
  return out + "}";
}

int Dump(const std::string& path) {
  Expected<std::unique_ptr<TraceReader>> r = TraceReader::Open(path);
  if (!r.ok()) {
    std::printf("{\"end\":\"open\",\"message\":%s,\"stop_offset\":0}\n", Quote(r.status().message()).c_str());
    return 1;
  }
  TraceReader& reader = **r;
  const pb::RunInfo& run = reader.run_info();
  std::string names;
  for (const pb::ParamInfo& p : run.params()) names += (names.empty() ? "" : ",") + Quote(p.name());
  std::printf("{\"run\":{\"producer\":%s,\"model_fingerprint\":%s,\"params\":[%s]}}\n", Quote(run.producer()).c_str(),
              Quote(run.model_fingerprint()).c_str(), names.c_str());
  Frame f;
  while (reader.Next(&f)) {
    if (f.step) {
      const pb::StepInfo& s = *f.step;
      std::printf("{\"type\":\"step\",\"step\":%lld,\"micro_step\":%d,\"loss\":%s,\"valid_tokens\":%lld,\"lr\":%s}\n",
                  static_cast<long long>(s.step()), s.micro_step(), HexDouble(s.loss()).c_str(),
                  static_cast<long long>(s.valid_tokens()), HexDouble(s.lr()).c_str());
    } else if (f.bucket) {
      const pb::BucketRecord& b = *f.bucket;
      std::string slices;
      for (const pb::Slice& s : b.slices()) slices += (slices.empty() ? "" : ",") + SliceJson(s);
      std::printf(
          "{\"type\":\"bucket\",\"step\":%lld,\"micro_step\":%d,\"bucket_id\":%d,\"phase\":%s,\"group\":%s,"
          "\"bucket_numel\":%lld,\"partition_offset\":%lld,\"partition_count\":%lld,\"divisor\":%s,\"chunk\":%d,"
          "\"chunk_count\":%d,\"slices\":[%s]}\n",
          static_cast<long long>(b.step()), b.micro_step(), b.bucket_id(), Quote(pb::Phase_Name(b.phase())).c_str(),
          Quote(b.group()).c_str(), static_cast<long long>(b.bucket_numel()),
          static_cast<long long>(b.partition_offset()), static_cast<long long>(b.partition_count()),
          HexDouble(b.divisor()).c_str(), b.chunk(), b.chunk_count(), slices.c_str());
    }
  }
  static constexpr const char* kCodes[] = {
      "ok", "io_error", "corruption", "truncated", "limit_exceeded", "invalid_argument", "mismatch"};
  const Status& st = reader.status();
  std::printf("{\"end\":\"%s\",\"message\":%s,\"stop_offset\":%llu}\n", kCodes[static_cast<int>(st.code())],
              Quote(st.message()).c_str(), static_cast<unsigned long long>(reader.stop_offset()));
  return st.ok() ? 0 : 1;
}

}  // namespace
}  // namespace gradtrace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "write") == 0) return gradtrace::Write(argv[2]);
  if (argc == 3 && std::strcmp(argv[1], "dump") == 0) return gradtrace::Dump(argv[2]);
  std::fprintf(stderr, "usage: gradtrace-pytest-writer {write|dump} PATH\n");
  return 2;
}
