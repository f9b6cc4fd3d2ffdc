// Sketch and stats slices computed with torch ops where the gradient lives
// (the GPU), so that only the K sketch values or a few moments per chunk cross
// to the host instead of the whole gradient. The Recorder uses it for
// non-CPU tensors in sketch and stats mode.
//
// On any device the result equals the host codec's MakeSlice for the same
// elements: exactly for sketch (the same positions, values widened exactly),
// and for stats with equal count, nonfinite and abs_max and sums within
//   |sum - host| <= 2^-40 * sum(|v_i|)
// (torch's reduction order is its own; both sides are double accumulations).
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

#include "gradtrace.pb.h"
#include "slice_codec.h"

namespace gradtrace::capture {

// `values`: the 1-D elements [offset, offset + numel) of `param`, of a dtype
// the codec knows (`dtype`). `positions`: SketchPositions of the parameter
// (sketch mode only). Mode must be sketch or stats. Blocks until the small
// result has reached the host.
pb::Slice DeviceSlice(const pb::ParamInfo& param, int64_t offset, const at::Tensor& values, pb::DType dtype,
                      const CaptureMode& mode, const std::vector<int64_t>& positions);

}  // namespace gradtrace::capture
