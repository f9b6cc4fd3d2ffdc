// Which reduction path a bucket takes: the one rule for gradtrace-train's
// reducer, the prediction, the DeepSpeed adapter (through _gtcodec) and the
// tests' synthetic traces.
//
//   stage 0     the engine's all-reduce (engine.py allreduce_gradients)
//   stage 1, 2  the ZeRO-1/2 optimizer's reduction (stage_1_and_2.py), whose
//               reduce_scatter setting picks the arithmetic inside it
//               (BucketContext.reduce_scatter)
//   stage 3     per IPG bucket, as stage3.py __reduce_and_partition_ipg_grads
//               decides (:1673 at DeepSpeed 0.19.8; the same test in every
//               release since 0.11.1, docs/studies/ds5248.md "ZeRO-3"):
//                 contiguous_gradients and bucket.elements <= reduce_bucket_size
//                 and not reduce_scatter -> __avg_scatter_contiguous_grads, an
//                 all-reduce (kZero3Allreduce); otherwise __avg_scatter_grads ->
//                 reduce_scatter_coalesced (kZero3ReduceScatter).
//               A bucket is flushed before a parameter that would overflow it
//               (stage3.py:1582-1583), so a bucket above reduce_bucket_size
//               holds one parameter, larger than that.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gradtrace.pb.h"
#include "scaling_policy.h"

namespace gradtrace::semantics {

// The ZeRO settings that choose the path; defaults are DeepSpeed's
// (runtime/zero/config.py:102, :108, :113 at 0.19.8).
struct ZeroSettings {
  int64_t reduce_bucket_size = 500000000;  // elements
  bool reduce_scatter = true;
  bool contiguous_gradients = true;
};

// What a trace records of them: Config.reduce_bucket_size (0: the default), and
// Config.extra "zero_reduce_scatter" and "zero_contiguous_gradients" ("true" or
// "false", as gradtrace-train and the DeepSpeed adapter write them); a setting
// not recorded is DeepSpeed's default.
ZeroSettings RecordedZeroSettings(const pb::Config& config);

// The path a bucket of `bucket_elements` elements takes under ZeRO stage
// `zero_stage` (0 to 3; above 3 is treated as 3).
ReductionPath ChooseReductionPath(int zero_stage, const ZeroSettings& settings, int64_t bucket_elements);

// The paths' names in the adapters and the binding: "engine", "zero",
// "zero3-reduce-scatter", "zero3-allreduce".
const char* ReductionPathName(ReductionPath path);
// Every path's name, in the table's order (the binding's reduction_paths()).
std::vector<std::string> ReductionPathNames();
std::optional<ReductionPath> ParseReductionPath(const std::string& name);

}  // namespace gradtrace::semantics
