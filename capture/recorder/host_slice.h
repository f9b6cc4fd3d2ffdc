// Sketch and stats slices of a CPU tensor, computed on the training thread
// without copying the gradient: the sketch from the parameter's cached
// positions, the stats as the codec's blocks (moments.h) spread over ATen's
// intra-op thread pool and merged in block order, so the bits equal
// MakeSlice's whatever the thread count.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

#include "gradtrace.pb.h"
#include "slice_codec.h"

namespace gradtrace::capture {

// `values`: the 1-D CPU elements [offset, offset + numel) of `param`, of a
// dtype the codec knows (`dtype`). `positions`: SketchPositions of the
// parameter (sketch mode only). Mode must be sketch or stats.
pb::Slice HostSlice(const pb::ParamInfo& param, int64_t offset, const at::Tensor& values, pb::DType dtype,
                    const CaptureMode& mode, const std::vector<int64_t>& positions);

// How many intra-op threads HostSlice's block loop runs on (at most
// at::get_num_threads()): more than one only where host_slice.cc is built with
// OpenMP, as torch is (at::parallel_for is header code). A test holds it to that.
int HostSliceThreads();

}  // namespace gradtrace::capture
