// The two ways the Recorder encodes sketch and stats slices on the training
// thread, against the host codec's MakeSlice: HostSlice (CPU tensors, stats on
// the intra-op pool) bit for bit; DeviceSlice (torch ops where the gradient
// lives) on CPU tensors, sketches exactly and stats within the bound stated in
// device_slice.h. On a GPU DeviceSlice runs the same ops as CUDA kernels.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "device_slice.h"
#include "host_slice.h"
#include "recorder.h"
#include "trace_reader.h"

namespace gradtrace::capture {
namespace {

pb::ParamInfo Param(const std::string& name, int64_t numel, pb::DType dtype) {
  pb::ParamInfo p;
  p.set_id(0);
  p.set_name(name);
  p.add_shape(numel);
  p.set_numel(numel);
  p.set_dtype(dtype);
  return p;
}

struct Case {
  at::ScalarType torch;
  pb::DType proto;
};
constexpr Case kCases[] = {
    {at::kFloat, pb::FP32}, {at::kBFloat16, pb::BF16}, {at::kHalf, pb::FP16}, {at::kDouble, pb::FP64}};

// N(0, 1e-2) gradients with NaN, +Inf and -Inf sprinkled in.
at::Tensor Gradient(int64_t n, at::ScalarType t, uint64_t seed) {
  at::manual_seed(seed);
  at::Tensor g = at::randn({n}, at::kDouble) * 1e-2;
  if (n > 300) {
    g.index_put_({at::arange(17, n, 997)}, NAN);
    g.index_put_({at::arange(29, n, 1499)}, INFINITY);
    g.index_put_({at::arange(31, n, 2003)}, -INFINITY);
  }
  return g.to(t);
}

// The codec's own encoding of a CPU tensor's elements.
pb::Slice HostSliceReference(const pb::ParamInfo& p, int64_t offset, const at::Tensor& v, pb::DType dtype,
                             const CaptureMode& mode) {
  const at::Tensor c = v.contiguous();
  return MakeSlice(p, offset, c.numel(), dtype, c.data_ptr(), mode);
}

TEST(HostSlice, EqualsTheHostCodecBitForBit) {
  // 3 Mi + 5 elements: many blocks, a short last one, several pool threads.
  const int64_t numel = (int64_t{3} << 20) + 5;
  for (const Case& c : kCases) {
    const pb::ParamInfo p = Param("head.weight", numel, c.proto);
    const at::Tensor g = Gradient(numel, c.torch, 4);
    for (const CaptureMode& mode :
         {CaptureMode{CaptureMode::Kind::kStats, 0}, CaptureMode{CaptureMode::Kind::kSketch, 300}}) {
      const auto positions = SketchPositions(p.name(), numel, 300);
      const at::Tensor v = g.narrow(0, 7, numel - 7);
      EXPECT_EQ(HostSlice(p, 7, v, c.proto, mode, positions).SerializeAsString(),
                HostSliceReference(p, 7, v, c.proto, mode).SerializeAsString())
          << DTypeName(c.proto) << " " << mode.ToString();
    }
  }
}

// The stats' blocks are spread over torch's intra-op threads: at::parallel_for splits only where host_slice.cc is
// compiled with OpenMP, and built without it every slice's stats ran on the training thread (capture stats 1.05x
// instead of 1.02-1.03x, tools/bench/capture_overhead).
TEST(HostSlice, SpreadsTheStatsOverTheIntraOpThreads) {
  const int before = at::get_num_threads();
  at::set_num_threads(2);
  EXPECT_EQ(HostSliceThreads(), 2);
  at::set_num_threads(1);
  EXPECT_EQ(HostSliceThreads(), 1);
  at::set_num_threads(before);
}

TEST(DeviceSlice, SketchEqualsTheHostCodecExactly) {
  const int64_t numel = 100000;
  for (const Case& c : kCases) {
    const pb::ParamInfo p = Param("block3.mlp.fc1.weight", numel, c.proto);
    const at::Tensor g = Gradient(numel, c.torch, 1);
    const CaptureMode mode{CaptureMode::Kind::kSketch, 512};
    const auto positions = SketchPositions(p.name(), numel, mode.k);
    // The whole parameter, and a partition slice as ZeRO hands it over.
    for (auto [offset, count] : {std::pair<int64_t, int64_t>{0, numel}, {33333, 25000}, {99990, 10}}) {
      const at::Tensor v = g.narrow(0, offset, count);
      const pb::Slice dev = DeviceSlice(p, offset, v, c.proto, mode, positions);
      const pb::Slice host = HostSliceReference(p, offset, v, c.proto, mode);
      EXPECT_EQ(dev.SerializeAsString(), host.SerializeAsString()) << DTypeName(c.proto) << " offset " << offset;
    }
  }
}

TEST(DeviceSlice, StatsMatchTheHostCodecWithinTheStatedBound) {
  // 5 Mi elements: more than one device chunk (4 Mi), merged on the host.
  for (int64_t numel : {int64_t{1}, int64_t{1000}, int64_t{5} << 20}) {
    for (const Case& c : kCases) {
      if (numel > 1000000 && c.torch != at::kFloat && c.torch != at::kBFloat16) continue;  // keep the test short
      const pb::ParamInfo p = Param("w", numel, c.proto);
      const at::Tensor g = Gradient(numel, c.torch, 2);
      const CaptureMode mode{CaptureMode::Kind::kStats, 0};
      const pb::StatsPayload dev = DeviceSlice(p, 0, g, c.proto, mode, {}).stats();
      const pb::StatsPayload host = HostSliceReference(p, 0, g, c.proto, mode).stats();
      const std::string what = std::string(DTypeName(c.proto)) + " n=" + std::to_string(numel);
      EXPECT_EQ(dev.count(), host.count()) << what;
      EXPECT_EQ(dev.nonfinite(), host.nonfinite()) << what;
      EXPECT_EQ(dev.abs_max(), host.abs_max()) << what;
      const at::Tensor x = g.to(at::kDouble);
      const at::Tensor z = x.masked_fill(at::isfinite(x).logical_not(), 0.0);
      const double sum_abs = z.abs().sum().item<double>(), sum_sq = (z * z).sum().item<double>();
      EXPECT_LE(std::fabs(dev.sum() - host.sum()), std::ldexp(sum_abs, -40)) << what;
      EXPECT_LE(std::fabs(dev.sum_sq() - host.sum_sq()), std::ldexp(sum_sq, -40)) << what;
    }
  }
}

// The Recorder's wiring: with the device path forced on CPU tensors, a sketch
// trace is byte-for-byte the host path's.
TEST(DeviceSlice, RecorderDevicePathWritesTheSameSketches) {
  pb::RunInfo run;
  run.set_producer("device_slice_test");
  run.set_run_id("r");
  *run.add_params() = Param("embed.weight", 4096, pb::FP32);
  std::vector<std::string> paths;
  for (bool device : {false, true}) {
    RecorderOptions opt;
    opt.path = (std::filesystem::temp_directory_path() /
                ("dev-slice-" + std::to_string(getpid()) + (device ? "-dev" : "-host") + ".gtrace"))
                   .string();
    opt.mode = CaptureMode{CaptureMode::Kind::kSketch, 64};
    opt.device_path_on_cpu = device;
    auto rec = Recorder::Open(opt, run);
    ASSERT_TRUE(rec.ok()) << rec.status().message();
    const at::Tensor g = Gradient(4096, at::kFloat, 3);
    BucketMeta meta;
    ASSERT_TRUE(
        (*rec)
            ->RecordBucket(meta, {SliceRef{0, 0, g.narrow(0, 0, 1000)}, SliceRef{0, 1000, g.narrow(0, 1000, 3096)}})
            .ok());
    ASSERT_TRUE((*rec)->Close().ok());
    paths.push_back(opt.path);
  }
  std::vector<std::string> records;
  for (const std::string& path : paths) {
    auto reader = TraceReader::Open(path);
    ASSERT_TRUE(reader.ok()) << reader.status().message();
    Frame f;
    std::string all;
    int positions = 0;
    while ((*reader)->Next(&f)) {
      if (!f.bucket) continue;
      all += f.bucket->SerializeAsString();
      for (const auto& s : f.bucket->slices()) positions += s.sketch().positions_size();
    }
    EXPECT_EQ(positions, 64) << path;  // every sketch position of the parameter, once
    records.push_back(all);
    std::filesystem::remove(path);
  }
  EXPECT_EQ(records[0], records[1]);
}

}  // namespace
}  // namespace gradtrace::capture
