#include "host_slice.h"

#include <ATen/Parallel.h>

#include <cassert>
#include <mutex>
#include <set>

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
  // Over torch's intra-op threads (this file is built with OpenMP: capture/CMakeLists.txt), a block (64 Ki
  // elements, ~30 us) at a time: the 23M model's 512x512 weights are 4 blocks each. The training thread's stats time
  // over 6 steps, grain 1 / 2 / 4 blocks: 0.128 / 0.134 / 0.137-0.140 s (0.247 s on that one thread alone).
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
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

int HostSliceThreads() {
  std::mutex mu;
  std::set<int> seen;
  at::parallel_for(0, 64, 1, [&](int64_t, int64_t) {
    std::lock_guard<std::mutex> lock(mu);
    seen.insert(at::get_thread_num());
  });
  return static_cast<int>(seen.size());
}

}  // namespace gradtrace::capture
