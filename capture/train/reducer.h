// DeepSpeed-style bucketed gradient reduction with capture of every phase.
//
// Gradient hooks record the order in which gradients become ready during
// backward; the first reduction fixes the bucket plan from that order (rank
// 0's order, broadcast, so every rank builds identical buckets). A bucket
// takes parameters in that order until adding the next would exceed
// --reduce-bucket-size elements (a larger parameter gets a bucket alone).
//
//   ZeRO 0  (engine path): dense buckets over the sdp group, then expert
//           buckets over the edp group; each bucket is flattened, scaled,
//           all-reduced and scaled again (semantics/scaling_policy.h).
//   ZeRO 1/2 (zero path):  one bucket stream; with reduce_scatter each flat
//           bucket is split into group-size partitions (the last ones may be
//           short or empty) and each partition is reduced to its owner.
//   ZeRO 3  (zero3 path):  as ZeRO 1/2, but the path is chosen per bucket as
//           stage3.py:1673 does (semantics/reduction_path.h): all-reduce when
//           reduce_scatter is false and the bucket holds at most
//           --reduce-bucket-size elements, else reduce-scatter (a parameter
//           larger than a bucket is alone in one).
//           Partitions are per flat bucket here, per parameter in DeepSpeed:
//           the same FINAL, another POST_REDUCE layout.
//
// Per bucket it records PRE_REDUCE (the rank's local flat bucket, before any
// scaling), POST_REDUCE (what the rank holds after collective and scaling:
// the whole bucket, or its partition with the layout in BucketMeta) and, after
// all buckets, FINAL (the full gradient per parameter; the owned partition
// slices only with FinalMode::kPartition). The optimizer always sees the full
// gradient, all-gathered from the partitions, in param.grad().
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

#include "grad_sink.h"
#include "model.h"
#include "process_groups.h"
#include "reduction_path.h"
#include "scaling_policy.h"

namespace gradtrace::capture {

// The policies and bucket plans live in semantics/ (shared with the diff).
using semantics::BucketContext;
using semantics::BucketScaling;
using semantics::PlanBucketScaling;
using semantics::ReductionPath;
using semantics::ResolvePolicy;
using semantics::ScaleOp;
using semantics::ScalingPolicy;
using semantics::ScalingRule;

struct ReduceConfig {
  int zero_stage = 0;
  ScalingPolicy policy;
  int64_t bucket_size = 500000000;
  double predivide_factor = 1.0;
  bool prescale = false;
  bool reduce_scatter = true;
  bool final_partition_only = false;
};

// The group whose reduction produces a parameter's gradient, as Bucket::group
// picks it: stage 0 (engine.py) reduces expert gradients over the
// expert-data-parallel group, every other path over dp x sp.
const NamedGroup& GradGroup(const Groups& groups, int zero_stage, bool expert);

struct Bucket {
  int32_t id = 0;
  std::vector<int> params;       // indices into the parameter list, in bucket order
  std::vector<int64_t> offsets;  // element offset of each parameter in the flat bucket
  int64_t numel = 0;
  bool has_moe = false;
  const NamedGroup* group = nullptr;
  ReductionPath path = ReductionPath::kEngineAllreduce;
  BucketScaling scaling;
};

class Reducer {
 public:
  Reducer(std::vector<NamedParam>* params, const Groups* groups, ReduceConfig config);
  ~Reducer();

  // Registers one hook per parameter; the hooks only append to the order list.
  void InstallHooks();

  // Runs after the backward of the last micro-step of a step: reduces every
  // bucket, leaves the final gradient in each parameter's grad(), and records
  // the phases to `sink` (may be null) when it wants `step`.
  Status Reduce(int64_t step, int32_t micro_step, GradSink* sink);

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const ReduceConfig& config() const { return config_; }

 private:
  // What a bucket's reduction leaves on this rank: the full reduced bucket and the range this rank owns.
  struct Reduced {
    at::Tensor full;
    int64_t own_begin = 0, own_count = 0;
  };

  void PlanBuckets();
  // The parameters in rank 0's gradient-ready order, unused ones last: the same on every rank.
  std::vector<int> AgreedOrder() const;
  // Cuts one stream of parameters (in order) into buckets of at most bucket_size elements.
  void PlanStream(const std::vector<int>& stream, bool expert_stream);
  // Plans `cur`'s path and scaling, appends it to buckets_ and leaves `cur` empty; nothing when it is empty.
  void CloseBucket(Bucket* cur, bool expert_stream);

  // PRE_REDUCE, the collective with its scaling, POST_REDUCE; records to `sink` unless it is null.
  Status ReduceBucket(const Bucket& b, BucketMeta meta, GradSink* sink, Reduced* d) const;
  // The engine and unpartitioned paths: every rank holds the whole reduced bucket.
  void AllReduce(const Bucket& b, at::Tensor& flat, Reduced* d) const;
  // The partitioned paths: each range reduced to its owner, scaled there, then all-gathered.
  void ReduceToOwners(const Bucket& b, at::Tensor& flat, Reduced* d) const;
  // Leaves the reduced gradient in each parameter's grad() and records FINAL unless `sink` is null.
  Status InstallFinal(const Bucket& b, const Reduced& d, BucketMeta meta, GradSink* sink);

  at::Tensor Flatten(const Bucket& b) const;
  std::vector<SliceRef> Slices(const Bucket& b, const at::Tensor& flat, int64_t begin, int64_t count) const;

  std::vector<NamedParam>* params_;
  const Groups* groups_;
  ReduceConfig config_;
  std::vector<int> ready_order_;
  std::vector<Bucket> buckets_;
  bool planned_ = false;
};

}  // namespace gradtrace::capture
