#include "synth_big.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <vector>

#include "rank_file.h"
#include "slice_codec.h"
#include "synth_trace.h"
#include "trace_writer.h"

namespace gradtrace::testing {
namespace fs = std::filesystem;

namespace {

pb::RunInfo BigRunInfo(const BigParamSpec& spec) {
  pb::RunInfo run;
  run.set_producer("gradtrace-synth");
  run.set_producer_version("big-param");
  run.set_run_id(spec.run_id);
  pb::Config* c = run.mutable_config();
  c->set_world(spec.dp);
  c->set_dp(spec.dp);
  c->set_sp(1);
  c->set_scaling("mean");
  c->set_loss("local-mean");
  c->set_gas(1);
  c->set_dtype(pb::FP32);
  c->set_seed(1);
  c->set_backend("gloo");
  c->set_capture_mode("full");
  c->set_steps(1);
  pb::ParamInfo* p = run.add_params();
  p->set_id(0);
  p->set_name("big.weight");
  p->add_shape(spec.numel);
  p->set_numel(spec.numel);
  p->set_dtype(pb::FP32);
  p->set_kind(pb::DENSE);
  p->set_grad_group("dp");
  run.set_model_fingerprint(ModelFingerprint(run));
  return run;
}

// One rank's file: StepInfo, then the FINAL record chunk by chunk.
Status WriteRank(const std::string& dir, const BigParamSpec& spec, const pb::RunInfo& run, int rank) {
  pb::RunInfo rr = run;
  rr.set_rank(rank);
  rr.set_dp_rank(rank);
  rr.set_host("localhost");
  pb::ProcessGroup* dp = rr.add_groups();
  dp->set_name("dp");
  for (int k = 0; k < spec.dp; ++k) dp->add_ranks(k);
  auto w = TraceWriter::Open((fs::path(dir) / RankFileName(rank)).string(), rr);
  if (!w.ok()) return w.status();
  pb::StepInfo si;
  si.set_step(0);
  si.set_micro_step(0);
  si.set_loss(2.5);
  si.set_valid_tokens(512);
  GT_RETURN_IF_ERROR((*w)->WriteStep(si));
  const CaptureMode full;
  const int64_t chunks = (spec.numel + kBigParamChunk - 1) / kBigParamChunk;
  std::vector<float> values;
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t lo = k * kBigParamChunk, n = std::min(kBigParamChunk, spec.numel - lo);
    values.resize(n);
    for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>(spec.factor * BigParamValue(lo + i));
    pb::BucketRecord rec;
    rec.set_step(0);
    rec.set_micro_step(0);
    rec.set_bucket_id(0);
    rec.set_phase(pb::FINAL);
    rec.set_bucket_numel(spec.numel);
    if (chunks > 1) {
      rec.set_chunk(static_cast<int32_t>(k));
      rec.set_chunk_count(static_cast<int32_t>(chunks));
      rec.set_last_slice_continues(k + 1 < chunks);
    }
    *rec.add_slices() = MakeSlice(rr.params(0), lo, n, pb::FP32, values.data(), full);
    GT_RETURN_IF_ERROR((*w)->WriteBucket(rec));
  }
  return (*w)->Close();
}

}  // namespace

float BigParamValue(int64_t index) {
  const int64_t k = static_cast<int64_t>(Mix(static_cast<uint64_t>(index)) % 2001) - 1000;
  return static_cast<float>(k) / 1024.0f;
}

Status WriteBigParamSet(const std::string& dir, const BigParamSpec& spec) {
  if (spec.numel <= 0 || spec.dp <= 0) return Status::InvalidArgument("--big-param wants numel > 0 and dp > 0");
  if ((spec.numel + kBigParamChunk - 1) / kBigParamChunk > (int64_t{1} << 30)) {
    return Status::InvalidArgument("--big-param: too many chunks");
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::IoError(dir + ": " + ec.message());
  const pb::RunInfo run = BigRunInfo(spec);
  for (int r = 0; r < spec.dp; ++r) GT_RETURN_IF_ERROR(WriteRank(dir, spec, run, r));
  return Status::Ok();
}

}  // namespace gradtrace::testing
