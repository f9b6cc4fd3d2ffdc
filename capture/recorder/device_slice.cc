#include "device_slice.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cassert>

#include "moments.h"

namespace gradtrace::capture {
namespace {

// Elements per reduction: bounds the device's temporary double copy (32 MiB).
constexpr int64_t kChunk = 1 << 22;

void FillSketchOnDevice(const at::Tensor& values, int64_t offset, const std::vector<int64_t>& positions,
                        pb::SketchPayload* out) {
  const int64_t count = values.numel();
  const auto lo = std::lower_bound(positions.begin(), positions.end(), offset);
  const auto hi = std::lower_bound(lo, positions.end(), offset + count);
  std::vector<int64_t> local(lo, hi);
  if (local.empty()) return;
  for (int64_t& p : local) p -= offset;
  const at::Tensor index = at::tensor(local, at::kLong).to(values.device());
  // Widening to double is exact for every dtype the codec records.
  const at::Tensor got = values.index_select(0, index).to(at::kDouble).to(at::kCPU).contiguous();
  const double* v = got.data_ptr<double>();
  for (size_t i = 0; i < local.size(); ++i) {
    out->add_positions(local[i] + offset);
    out->add_values(v[i]);
  }
}

void FillStatsOnDevice(const at::Tensor& values, pb::StatsPayload* out) {
  const int64_t count = values.numel();
  // Per chunk: finite count, sum, sum of squares, abs-max; one transfer for all.
  std::vector<at::Tensor> rows;
  for (int64_t b = 0; b < count; b += kChunk) {
    const at::Tensor x = values.narrow(0, b, std::min(kChunk, count - b)).to(at::kDouble);
    const at::Tensor finite = at::isfinite(x);
    const at::Tensor z = x.masked_fill(finite.logical_not(), 0.0);
    rows.push_back(at::stack({finite.sum().to(at::kDouble), z.sum(), (z * z).sum(), z.abs().max()}));
  }
  Moments total;
  if (!rows.empty()) {
    const at::Tensor host = at::stack(rows).to(at::kCPU).contiguous();
    const double* r = host.data_ptr<double>();
    for (size_t i = 0; i < rows.size(); ++i, r += 4) {
      Moments m;
      m.count = static_cast<int64_t>(r[0]);
      m.sum = r[1];
      m.sum_sq = r[2];
      m.abs_max = r[3];
      total.Merge(m);
    }
  }
  total.nonfinite = count - total.count;
  total.Fill(out);
}

}  // namespace

pb::Slice DeviceSlice(const pb::ParamInfo& param, int64_t offset, const at::Tensor& values, pb::DType dtype,
                      const CaptureMode& mode, const std::vector<int64_t>& positions) {
  assert(mode.kind != CaptureMode::Kind::kFull);
  pb::Slice s;
  s.set_param_id(param.id());
  s.set_offset(offset);
  s.set_count(values.numel());
  s.set_dtype(dtype);
  const at::Tensor flat = values.detach().reshape({-1});
  if (mode.kind == CaptureMode::Kind::kSketch) {
    s.mutable_sketch()->set_k(mode.k);
    FillSketchOnDevice(flat, offset, positions, s.mutable_sketch());
  } else {
    FillStatsOnDevice(flat, s.mutable_stats());
  }
  return s;
}

}  // namespace gradtrace::capture
