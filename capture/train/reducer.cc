#include "reducer.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace gradtrace::capture {

namespace {

void Apply(at::Tensor& t, const std::vector<ScaleOp>& ops) {
  for (const auto& op : ops) {
    if (op.divide) {
      t.div_(op.value);
    } else {
      t.mul_(op.value);
    }
  }
}

int GroupRank(const NamedGroup& g) { return g.ranks.size() <= 1 ? 0 : g.pg->getRank(); }

// The settings that choose each bucket's path (semantics/reduction_path.h). Buckets here are always flat
// copies: contiguous_gradients, DeepSpeed's default.
semantics::ZeroSettings ZeroSettingsOf(const ReduceConfig& c) {
  semantics::ZeroSettings s;
  s.reduce_bucket_size = c.bucket_size;
  s.reduce_scatter = c.reduce_scatter;
  s.contiguous_gradients = true;
  return s;
}

}  // namespace

const NamedGroup& GradGroup(const Groups& groups, int zero_stage, bool expert) {
  return zero_stage == 0 && expert ? groups.edp : groups.sdp;
}

Reducer::Reducer(std::vector<NamedParam>* params, const Groups* groups, ReduceConfig config)
    : params_(params), groups_(groups), config_(std::move(config)) {}

Reducer::~Reducer() = default;

void Reducer::InstallHooks() {
  for (size_t i = 0; i < params_->size(); ++i) {
    (*params_)[i].tensor.register_hook([this, i](const at::Tensor&) {
      if (!planned_) ready_order_.push_back(static_cast<int>(i));
    });
  }
}

std::vector<int> Reducer::AgreedOrder() const {
  const int n = static_cast<int>(params_->size());
  std::vector<int> order;
  std::vector<bool> seen(n, false);
  for (int i : ready_order_) {
    if (!seen[i]) {
      seen[i] = true;
      order.push_back(i);
    }
  }
  // Parameters without a gradient this step (unused experts) go last, in
  // reverse registration order, which is where backward would have put them.
  for (int i = n - 1; i >= 0; --i) {
    if (!seen[i]) order.push_back(i);
  }
  // Rank 0's order for everyone: buckets must match across the group.
  at::Tensor t = at::tensor(std::vector<int64_t>(order.begin(), order.end()), at::kLong).to(groups_->device);
  Broadcast(groups_->world, t, 0);
  t = t.cpu();
  for (int i = 0; i < n; ++i) order[i] = static_cast<int>(t[i].item<int64_t>());
  return order;
}

void Reducer::CloseBucket(Bucket* cur, bool expert_stream) {
  if (cur->params.empty()) return;
  cur->id = static_cast<int32_t>(buckets_.size());
  cur->group = &GradGroup(*groups_, config_.zero_stage, expert_stream);
  BucketContext ctx;
  ctx.path = semantics::ChooseReductionPath(config_.zero_stage, ZeroSettingsOf(config_), cur->numel);
  cur->path = ctx.path;
  ctx.group_size = static_cast<int>(cur->group->ranks.size());
  ctx.sp = groups_->topo.sp;
  ctx.has_moe = cur->has_moe;
  ctx.predivide_factor = config_.predivide_factor;
  ctx.prescale = config_.prescale;
  ctx.reduce_scatter = config_.reduce_scatter;
  cur->scaling = PlanBucketScaling(config_.policy, ctx);
  buckets_.push_back(std::move(*cur));
  *cur = Bucket();
}

void Reducer::PlanStream(const std::vector<int>& stream, bool expert_stream) {
  Bucket cur;
  for (int i : stream) {
    const int64_t numel = (*params_)[i].tensor.numel();
    if (!cur.params.empty() && cur.numel + numel > config_.bucket_size) CloseBucket(&cur, expert_stream);
    cur.params.push_back(i);
    cur.offsets.push_back(cur.numel);
    cur.numel += numel;
    cur.has_moe |= (*params_)[i].expert;
  }
  CloseBucket(&cur, expert_stream);
}

void Reducer::PlanBuckets() {
  const std::vector<int> order = AgreedOrder();
  if (config_.zero_stage == 0) {
    // engine.py reduces non-expert gradients first, then expert gradients per expert group.
    std::vector<int> dense, expert;
    for (int i : order) ((*params_)[i].expert ? expert : dense).push_back(i);
    PlanStream(dense, /*expert_stream=*/false);
    PlanStream(expert, /*expert_stream=*/true);
  } else {
    PlanStream(order, /*expert_stream=*/false);
  }
  ready_order_.clear();
  planned_ = true;
}

at::Tensor Reducer::Flatten(const Bucket& b) const {
  std::vector<at::Tensor> parts;
  for (int i : b.params) {
    const at::Tensor& p = (*params_)[i].tensor;
    parts.push_back(p.grad().defined() ? p.grad().reshape({-1}) : at::zeros({p.numel()}, p.options()));
  }
  return at::cat(parts).detach();
}

std::vector<SliceRef> Reducer::Slices(const Bucket& b, const at::Tensor& flat, int64_t begin, int64_t count) const {
  std::vector<SliceRef> out;
  const int64_t end = begin + count;
  for (size_t k = 0; k < b.params.size(); ++k) {
    const int64_t off = b.offsets[k], numel = (*params_)[b.params[k]].tensor.numel();
    const int64_t lo = std::max(begin, off), hi = std::min(end, off + numel);
    if (lo >= hi) continue;
    out.push_back({b.params[k], lo - off, flat.narrow(0, lo, hi - lo)});
  }
  return out;
}

void Reducer::AllReduce(const Bucket& b, at::Tensor& flat, Reduced* d) const {
  const NamedGroup& g = *b.group;
  if (g.ranks.size() > 1) {
    std::vector<at::Tensor> v{flat};
    g.pg->allreduce(v)->wait();
  }
  Apply(flat, b.scaling.post);
  d->full = flat;
  d->own_begin = 0;
  d->own_count = b.numel;
}

void Reducer::ReduceToOwners(const Bucket& b, at::Tensor& flat, Reduced* d) const {
  const NamedGroup& g = *b.group;
  const int G = static_cast<int>(g.ranks.size());
  // Partition p owns [p*part, (p+1)*part) of the flat bucket, clipped to
  // numel; DeepSpeed reduces each range to its owner (dist.reduce).
  const int64_t part = (b.numel + G - 1) / G;
  const int me = GroupRank(g);
  for (int p = 0; p < G; ++p) {
    const int64_t begin = std::min<int64_t>(p * part, b.numel);
    const int64_t count = std::min<int64_t>(part, b.numel - begin);
    if (count == 0 || G == 1) continue;
    std::vector<at::Tensor> v{flat.narrow(0, begin, count)};
    c10d::ReduceOptions opts;
    opts.rootRank = p;
    g.pg->reduce(v, opts)->wait();
  }
  d->own_begin = std::min<int64_t>(me * part, b.numel);
  d->own_count = std::min<int64_t>(part, b.numel - d->own_begin);
  at::Tensor own = flat.narrow(0, d->own_begin, d->own_count);
  Apply(own, b.scaling.post);
  // All-gather the partitions so the optimizer sees the full gradient
  // (what ZeRO's parameter all-gather after the partitioned step amounts to).
  if (G > 1) {
    at::Tensor mine = at::zeros({part}, flat.options());
    mine.narrow(0, 0, d->own_count).copy_(own);
    at::Tensor all = at::empty({part * G}, flat.options());
    g.pg->all_gather_single(all, mine)->wait();
    d->full = all.narrow(0, 0, b.numel);
  } else {
    d->full = flat;
  }
}

Status Reducer::ReduceBucket(const Bucket& b, BucketMeta meta, GradSink* sink, Reduced* d) const {
  const bool partitioned = b.path == ReductionPath::kZero3ReduceScatter ||
                           (b.path == ReductionPath::kZeroPartitioned && config_.reduce_scatter);
  at::Tensor flat = Flatten(b);
  meta.group = b.group->name;
  meta.partition_offset = 0;
  meta.partition_count = b.numel;
  meta.phase = pb::PRE_REDUCE;
  if (sink != nullptr) GT_RETURN_IF_ERROR(sink->OnBucket(meta, Slices(b, flat, 0, b.numel)));

  Apply(flat, b.scaling.pre);
  if (partitioned) {
    ReduceToOwners(b, flat, d);
    meta.partition_offset = d->own_begin;
    meta.partition_count = d->own_count;
  } else {
    AllReduce(b, flat, d);
  }
  meta.phase = pb::POST_REDUCE;
  if (sink != nullptr) GT_RETURN_IF_ERROR(sink->OnBucket(meta, Slices(b, d->full, d->own_begin, d->own_count)));
  return Status::Ok();
}

Status Reducer::InstallFinal(const Bucket& b, const Reduced& d, BucketMeta meta, GradSink* sink) {
  for (size_t k = 0; k < b.params.size(); ++k) {
    at::Tensor& p = (*params_)[b.params[k]].tensor;
    p.mutable_grad() = d.full.narrow(0, b.offsets[k], p.numel()).view(p.sizes());
  }
  if (sink == nullptr) return Status::Ok();
  meta.phase = pb::FINAL;
  if (config_.final_partition_only) {
    meta.partition_offset = d.own_begin;
    meta.partition_count = d.own_count;
    return sink->OnBucket(meta, Slices(b, d.full, d.own_begin, d.own_count));
  }
  meta.partition_count = b.numel;
  return sink->OnBucket(meta, Slices(b, d.full, 0, b.numel));
}

Status Reducer::Reduce(int64_t step, int32_t micro_step, GradSink* sink) {
  if (!planned_) PlanBuckets();
  // A sink that does not want this step records nothing: null from here on.
  GradSink* recording = sink != nullptr && sink->WantsStep(step) ? sink : nullptr;
  auto meta_of = [&](const Bucket& b) {
    BucketMeta meta;
    meta.step = step;
    meta.micro_step = micro_step;
    meta.bucket_id = b.id;
    meta.bucket_numel = b.numel;
    meta.divisor = b.scaling.Divisor();
    return meta;
  };
  std::vector<Reduced> done(buckets_.size());
  for (const auto& b : buckets_) GT_RETURN_IF_ERROR(ReduceBucket(b, meta_of(b), recording, &done[b.id]));
  // FINAL after every bucket is reduced, as the optimizer sees the gradients.
  for (const auto& b : buckets_) GT_RETURN_IF_ERROR(InstallFinal(b, done[b.id], meta_of(b), recording));
  return Status::Ok();
}

}  // namespace gradtrace::capture
