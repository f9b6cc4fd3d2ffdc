#include "host_slice.h"

#include <ATen/Parallel.h>

#include <cassert>

#include "moments.h"

namespace gradtrace::capture {

pb::Slice HostSlice(const pb::ParamInfo& param, int64_t offset, const at::Tensor& values, pb::DType dtype,
                    const CaptureMode& mode, const std::vector<int64_t>& positions) {
  assert(mode.kind != CaptureMode::Kind::kFull && values.is_cpu());
  const at::Tensor flat = values.detach().reshape({-1}).contiguous();
  const int64_t count = flat.numel();
  if (mode.kind == CaptureMode::Kind::kSketch) {
    return MakeSlice(param, offset, count, dtype, flat.data_ptr(), mode, &positions);
  }
  pb::Slice s;
  s.set_param_id(param.id());
  s.set_offset(offset);
  s.set_count(count);
  s.set_dtype(dtype);
  const auto* p = static_cast<const uint8_t*>(flat.data_ptr());
  const int64_t width = static_cast<int64_t>(flat.element_size());
  const int64_t blocks = (count + kMomentsBlock - 1) / kMomentsBlock;
  std::vector<Moments> parts(blocks);
  // Grain 4 blocks (256 Ki elements): below that a thread costs more than it saves.
  at::parallel_for(0, blocks, 4, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t first = b * kMomentsBlock;
      parts[b] = BlockMoments(dtype, p + first * width, std::min(kMomentsBlock, count - first));
    }
  });
  Moments total;
  for (const Moments& m : parts) total.Merge(m);
  total.Fill(s.mutable_stats());
  return s;
}

}  // namespace gradtrace::capture
