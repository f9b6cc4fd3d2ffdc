#include "load/term_set.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "dtype.h"
#include "load/trace_set.h"
#include "rank_file.h"
#include "slice_codec.h"
#include "trace_reader.h"
#include "trace_writer.h"

namespace gradtrace::diff {

namespace {

using RecordKey = std::tuple<int64_t, int32_t, int32_t, int32_t, std::string>;  // step, micro, bucket, chunk, slices

RecordKey KeyOf(const pb::BucketRecord& r) {
  std::string slices;
  for (const pb::Slice& s : r.slices()) {
    slices += std::to_string(s.param_id()) + ":" + std::to_string(s.offset()) + ":" + std::to_string(s.count()) + ";";
  }
  return {r.step(), r.micro_step(), r.bucket_id(), r.chunk(), slices};
}

// One rank's baseline: its FINAL records by key, its losses by (step, micro-step, optimizer step).
struct Baseline {
  std::map<RecordKey, pb::BucketRecord> finals;
  std::map<std::tuple<int64_t, int32_t, bool>, double> losses;
};

Expected<Baseline> ReadBaseline(const std::string& path) {
  auto reader = TraceReader::Open(path);
  if (!reader.ok()) return reader.status();
  Baseline b;
  Frame f;
  while ((*reader)->Next(&f)) {
    if (f.bucket && f.bucket->phase() == pb::FINAL) b.finals.emplace(KeyOf(*f.bucket), std::move(*f.bucket));
    if (f.step) b.losses[{f.step->step(), f.step->micro_step(), f.step->optimizer_step()}] = f.step->loss();
  }
  if (!(*reader)->status().ok()) return (*reader)->status();
  return b;
}

// Per (parameter id, step): the sums of squares of the side and of its term's part.
using Norms = std::map<std::pair<int32_t, int64_t>, std::pair<double, double>>;

// `side`'s slice minus `base`'s, in the side's dtype; their sums of squares added to *norms at `at`.
Expected<pb::Slice> Minus(const pb::RunInfo& run, const pb::Slice& side, const pb::Slice& base,
                          const std::string& where, std::pair<double, double>* norms) {
  if (!side.has_full() || !base.has_full()) {
    return Status::InvalidArgument(where + ": the decomposition needs full traces (capture mode full)");
  }
  auto a = DecodeFullValues(side);
  if (!a.ok()) return a.status();
  auto c = DecodeFullValues(base);
  if (!c.ok()) return c.status();
  const size_t width = DTypeSize(side.dtype());
  std::vector<uint8_t> bytes(a->size() * width);
  if (a->size() != c->size()) return Status::InvalidArgument(where + ": the baseline's slice has other values");
  for (size_t i = 0; i < a->size(); ++i) {
    const double d = (*a)[i] - (*c)[i];
    norms->first += (*a)[i] * (*a)[i];
    norms->second += d * d;
    DoubleToElement(side.dtype(), d, &bytes[i * width]);
  }
  CaptureMode full;
  return MakeSlice(run.params(side.param_id()), side.offset(), side.count(), side.dtype(), bytes.data(), full);
}

Status WriteRank(const std::string& side_path, const std::string& base_path, const std::string& out_path,
                 Norms* norms) {
  auto base = ReadBaseline(base_path);
  if (!base.ok()) return base.status();
  auto reader = TraceReader::Open(side_path);
  if (!reader.ok()) return reader.status();
  pb::RunInfo run = (*reader)->run_info();
  (*run.mutable_extra())["term_of"] = "this run minus the baseline " + base_path;
  auto writer = TraceWriter::Open(out_path, run);
  if (!writer.ok()) return writer.status();
  Frame f;
  while ((*reader)->Next(&f)) {
    if (f.step) {
      auto it = base->losses.find({f.step->step(), f.step->micro_step(), f.step->optimizer_step()});
      if (it != base->losses.end()) f.step->set_loss(f.step->loss() - it->second);
      GT_RETURN_IF_ERROR((*writer)->WriteStep(*f.step));
      continue;
    }
    if (!f.bucket || f.bucket->phase() != pb::FINAL) continue;
    const std::string where = side_path + ": FINAL of step " + std::to_string(f.bucket->step()) + ", bucket " +
                              std::to_string(f.bucket->bucket_id());
    auto match = base->finals.find(KeyOf(*f.bucket));
    if (match == base->finals.end()) {
      return Status::InvalidArgument(where + ": the baseline " + base_path + " has no record of the same slices");
    }
    pb::BucketRecord out = *f.bucket;
    for (int i = 0; i < out.slices_size(); ++i) {
      auto diff = Minus(run, f.bucket->slices(i), match->second.slices(i), where,
                        &(*norms)[{f.bucket->slices(i).param_id(), f.bucket->step()}]);
      if (!diff.ok()) return diff.status();
      *out.mutable_slices(i) = std::move(*diff);
    }
    GT_RETURN_IF_ERROR((*writer)->WriteBucket(out));
  }
  if (!(*reader)->status().ok()) return (*reader)->status();
  return (*writer)->Close();
}

}  // namespace

Expected<std::map<std::string, double>> WriteTermSet(const std::string& side, const std::string& baseline,
                                                     const std::string& out) {
  auto a = TraceSet::Load(side);
  if (!a.ok()) return a.status();
  auto c = TraceSet::Load(baseline);
  if (!c.ok()) return c.status();
  if (a->world() != c->world() || ModelFingerprint(a->run()) != ModelFingerprint(c->run())) {
    return Status::InvalidArgument("--baseline " + baseline + ": not the same model and world as " + side + " (" +
                                   std::to_string(c->world()) + " rank(s) against " + std::to_string(a->world()) +
                                   "): the baseline is the same run with the term switched off");
  }
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) return Status::IoError(out + ": " + ec.message());
  Norms norms;
  for (int r = 0; r < a->world(); ++r) {
    const std::string name = RankFileName(r);
    GT_RETURN_IF_ERROR(WriteRank((std::filesystem::path(side) / name).string(),
                                 (std::filesystem::path(baseline) / name).string(),
                                 (std::filesystem::path(out) / name).string(), &norms));
  }
  std::map<std::string, double> ratio;
  for (const auto& [key, sums] : norms) {
    const double r = sums.second > 0 ? std::sqrt(sums.first / sums.second) : std::numeric_limits<double>::infinity();
    double& worst = ratio[a->run().params(key.first).name()];
    worst = std::max(worst, r);
  }
  return ratio;
}

}  // namespace gradtrace::diff
