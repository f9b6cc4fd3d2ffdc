// Codec throughput: encoding a gradient slice in each capture mode, and writing
// and reading a trace of full fp32 slices. Reports bytes/s of raw gradient
// data; run `build/bin/gradtrace-codec-bench` (Google Benchmark flags apply).
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "moments.h"
#include "slice_codec.h"
#include "trace_reader.h"
#include "trace_writer.h"

namespace gradtrace {
namespace {

constexpr int64_t kNumel = 1 << 22;  // 4 Mi fp32 elements, 16 MiB: one large parameter

const std::vector<float>& Gradient() {
  static const std::vector<float> g = [] {
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.f, 1e-3f);
    std::vector<float> v(kNumel);
    for (float& x : v) x = d(rng);
    return v;
  }();
  return g;
}

pb::RunInfo Run() {
  pb::RunInfo run;
  run.set_producer("codec_bench");
  pb::ParamInfo* p = run.add_params();
  p->set_id(0);
  p->set_name("layer.weight");
  p->add_shape(kNumel);
  p->set_numel(kNumel);
  p->set_dtype(pb::FP32);
  return run;
}

void BM_MakeSlice(benchmark::State& state, const char* mode_text) {
  const pb::RunInfo run = Run();
  CaptureMode mode = ParseCaptureMode(mode_text).value();
  for (auto _ : state) {
    pb::Slice s = MakeSlice(run.params(0), 0, kNumel, pb::FP32, Gradient().data(), mode);
    benchmark::DoNotOptimize(s);
  }
  state.SetBytesProcessed(state.iterations() * kNumel * 4);
}
BENCHMARK_CAPTURE(BM_MakeSlice, full, "full")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MakeSlice, sketch_4096, "sketch:4096")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MakeSlice, stats, "stats")->Unit(benchmark::kMillisecond);

// The stats kernel alone, one thread, on the 16 MiB fp32 gradient: the baseline build (16-byte vectors)
// against what BlockMoments dispatches to (the AVX2 build where the CPU has it; the label says which).
void BM_StatsKernel(benchmark::State& state, bool baseline) {
  const float* g = Gradient().data();
  for (auto _ : state) {
    Moments total;
    for (int64_t b = 0; b < kNumel; b += kMomentsBlock) {
      const int64_t n = std::min(kMomentsBlock, kNumel - b);
      total.Merge(baseline ? BlockMomentsBaseline(pb::FP32, g + b, n) : BlockMoments(pb::FP32, g + b, n));
    }
    benchmark::DoNotOptimize(total);
  }
  state.SetBytesProcessed(state.iterations() * kNumel * 4);
  state.SetLabel(baseline ? "baseline" : (MomentsKernelIsAvx2() ? "avx2" : "baseline (no AVX2)"));
}
BENCHMARK_CAPTURE(BM_StatsKernel, baseline, true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_StatsKernel, dispatched, false)->Unit(benchmark::kMillisecond);

std::string BenchPath() { return "/tmp/gradtrace-codec-bench-" + std::to_string(getpid()) + ".gtrace"; }

// Writes 8 buckets of the full gradient: shuffle + zstd + CRC + fflush per frame.
void WriteTrace(const std::string& path, int zstd_level) {
  WriterOptions wo;
  wo.zstd_level = zstd_level;
  wo.overwrite = true;  // the same file every iteration
  auto w = TraceWriter::Open(path, Run(), wo);
  const pb::RunInfo run = Run();
  pb::BucketRecord rec;
  *rec.add_slices() = MakeSlice(run.params(0), 0, kNumel, pb::FP32, Gradient().data(), CaptureMode{});
  for (int b = 0; b < 8; ++b) {
    rec.set_bucket_id(b);
    if (!(*w)->WriteBucket(rec).ok()) std::abort();
  }
  if (!(*w)->Close().ok()) std::abort();
}

void BM_WriteFull(benchmark::State& state) {
  const std::string path = BenchPath();
  for (auto _ : state) WriteTrace(path, static_cast<int>(state.range(0)));
  state.SetBytesProcessed(state.iterations() * 8 * kNumel * 4);
  std::remove(path.c_str());
}
BENCHMARK(BM_WriteFull)->Arg(1)->Arg(3)->Unit(benchmark::kMillisecond);

void BM_ReadFull(benchmark::State& state) {
  const std::string path = BenchPath();
  WriteTrace(path, 3);
  for (auto _ : state) {
    auto r = TraceReader::Open(path);
    Frame f;
    double sum = 0;
    while ((*r)->Next(&f)) {
      if (f.bucket) sum += DecodeFullValues(f.bucket->slices(0))->at(0);
    }
    benchmark::DoNotOptimize(sum);
  }
  state.SetBytesProcessed(state.iterations() * 8 * kNumel * 4);
  std::remove(path.c_str());
}
BENCHMARK(BM_ReadFull)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace gradtrace

BENCHMARK_MAIN();
