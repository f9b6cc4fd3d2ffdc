// Test fixture generator for the gradtrace-inspect exit-code test:
//   proto_write_sample_trace DIR
// writes a two-rank trace set DIR/set/rank-0000{0,1}.gtrace and two damaged
// files, DIR/truncated.gtrace (cut mid-frame) and DIR/corrupt.gtrace (one
// payload byte changed).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "slice_codec.h"
#include "trace_writer.h"

using namespace gradtrace;

static bool WriteRank(const std::string& path, int rank) {
  pb::RunInfo run;
  run.set_producer("write_sample_trace");
  run.set_producer_version("0.1.0");
  run.set_rank(rank);
  run.mutable_config()->set_world(2);
  run.mutable_config()->set_dp(2);
  run.mutable_config()->set_sp(1);
  pb::ProcessGroup* g = run.add_groups();
  g->set_name("dp");
  g->add_ranks(0);
  g->add_ranks(1);
  pb::ParamInfo* p = run.add_params();
  p->set_name("w");
  p->add_shape(64);
  p->add_shape(64);
  p->set_dtype(pb::FP32);
  auto w = TraceWriter::Open(path, run);
  if (!w.ok()) return false;
  std::vector<float> v(4096);
  for (int step = 0; step < 2; ++step) {
    pb::StepInfo s;
    s.set_step(step);
    s.set_loss(1.0 / (step + 1));
    if (!(*w)->WriteStep(s).ok()) return false;
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 7 + step) % 101) * 1e-3f;
    for (pb::Phase phase : {pb::PRE_REDUCE, pb::POST_REDUCE, pb::FINAL}) {
      pb::BucketRecord r;
      r.set_step(step);
      r.set_phase(phase);
      *r.add_slices() = MakeSlice(run.params(0), 0, 4096, pb::FP32, v.data(), CaptureMode{});
      if (!(*w)->WriteBucket(r).ok()) return false;
    }
  }
  return (*w)->Close().ok();
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  std::filesystem::create_directories(dir + "/set");
  if (!WriteRank(dir + "/set/rank-00000.gtrace", 0) || !WriteRank(dir + "/set/rank-00001.gtrace", 1)) return 1;
  std::ifstream in(dir + "/set/rank-00000.gtrace", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  std::ofstream(dir + "/truncated.gtrace", std::ios::binary).write(bytes.data(), bytes.size() * 2 / 3);
  // A payload byte of the first data frame (after the file header and the RunInfo frame), so that only the
  // CRC can catch it; a byte picked by file position could land in a header field the CRC does not cover.
  const size_t runinfo_len = static_cast<uint8_t>(bytes[16]) | static_cast<uint8_t>(bytes[17]) << 8 |
                             static_cast<size_t>(static_cast<uint8_t>(bytes[18])) << 16;
  bytes[16 + 16 + runinfo_len + 16 + 2] ^= 0x20;
  std::ofstream(dir + "/corrupt.gtrace", std::ios::binary).write(bytes.data(), bytes.size());
  return 0;
}
