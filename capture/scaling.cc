#include "scaling.h"

#include <array>
#include <cstdlib>

namespace gradtrace::capture {

namespace {

// One row per DeepSpeed release read (pip download deepspeed==X --no-deps).
// Line numbers are those of the released sdist at that version.
struct VersionRow {
  const char* version;
  ScalingRule engine;
  const char* engine_cite;
  ScalingRule zero;
  const char* zero_cite;
  // Non-empty: the release's stage-0 path reduces over another group than the
  // emulation's (sdp), so stage 0 with sp > 1 is refused for it.
  const char* engine_unmodelled = "";
  // ZeRO-3 (stage3.py): the two paths' rules; zero3_cite empty: stage3.py of
  // this release was not read, so stage 3 is refused for it.
  ScalingRule zero3_reduce_scatter = ScalingRule::kMean;
  ScalingRule zero3_allreduce = ScalingRule::kDs4530;
  const char* zero3_cite = "";
};

// The engine divides by the size of the sequence-data-parallel group
// (dp*sp) until 0.14.0, and by that size / sp from 0.14.x on
// (_reduce_non_expert_gradients passes dp_world_size). ZeRO-1/2 divides by
// dp_process_group size / sp (the sdp group when sp > 1) in every release
// read; 0.12.6 also passes divide=self.ipg_bucket_has_moe_params to
// allreduce_bucket, dividing MoE buckets twice — PR #4957 made it
// divide=False (first released in 0.13.1).
constexpr std::array<VersionRow, 14> kVersions = {{
    // The last release before PR #4530: ZeRO-1/2 divides by the whole sdp group, no / sp.
    {"0.11.1", ScalingRule::kMean, "deepspeed/runtime/engine.py:2308,2371 @ v0.11.1: mul_(1/world(mpu dp group))",
     ScalingRule::kMean,
     "deepspeed/runtime/zero/stage_1_and_2.py:1028 (dense), 988 (MoE) @ v0.11.1: div_(world(sdp group)), no / sp",
     "engine.py:2371 @ v0.11.1 all-reduces over mpu.get_data_parallel_group(), which leaves out the SP ranks"},
    // PR #4530 first shipped in 0.11.2 (0.11.1 has no sequence_parallel_size in stage_1_and_2.py).
    {"0.11.2", ScalingRule::kMean, "deepspeed/runtime/engine.py:2315 @ v0.11.2: mul_(1/world(sdp group)), no /sp",
     ScalingRule::kDs4530,
     "deepspeed/runtime/zero/stage_1_and_2.py:1030 @ v0.11.2: div_(world(dp group)/sp), PR #4530"},
    {"0.12.2", ScalingRule::kMean, "deepspeed/runtime/engine.py:2313,2315 @ v0.12.2: mul_(1/world(sdp group))",
     ScalingRule::kDs4530,
     "deepspeed/runtime/zero/stage_1_and_2.py:1030 (dense), 990 (MoE) @ v0.12.2: div_(world(dp group)/sp)"},
    {"0.12.3", ScalingRule::kMean, "deepspeed/runtime/engine.py:2317,2319 @ v0.12.3: mul_(1/world(sdp group))",
     ScalingRule::kDs4530,
     "deepspeed/runtime/zero/stage_1_and_2.py:1030 (dense), 990 (MoE) @ v0.12.3: div_(world(dp group)/sp)"},
    {"0.12.6", ScalingRule::kMean, "deepspeed/runtime/engine.py:2332,2334 @ v0.12.6: mul_(1/world(sdp group))",
     ScalingRule::kDsPre4957,
     "deepspeed/runtime/zero/stage_1_and_2.py:1072 (dense), 1032 (MoE) @ v0.12.6: div_(world/sp); MoE buckets "
     "again via divide=True at 1090,1097 -> allreduce_bucket 1458"},
    {"0.13.0", ScalingRule::kMean, "deepspeed/runtime/engine.py:2343 @ v0.13.0: mul_(1/world(sdp group))",
     ScalingRule::kDsPre4957,
     "deepspeed/runtime/zero/stage_1_and_2.py:1094 @ v0.13.0: div_(world/sp); MoE buckets again via "
     "divide=ipg_bucket_has_moe_params at 1112,1119 -> allreduce_bucket 1479"},
    {"0.13.1", ScalingRule::kMean, "deepspeed/runtime/engine.py:2341,2343 @ v0.13.1: mul_(1/world(sdp group))",
     ScalingRule::kDs4530,
     "deepspeed/runtime/zero/stage_1_and_2.py:1094 (dense), 1054 (MoE) @ v0.13.1: div_(world/sp); divide=False at "
     "1112,1119 (PR #4957)"},
    {"0.13.2", ScalingRule::kMean, "deepspeed/runtime/engine.py:2351,2353 @ v0.13.2: mul_(1/world(sdp group))",
     ScalingRule::kDs4530,
     "deepspeed/runtime/zero/stage_1_and_2.py:1107 (dense), 1067 (MoE) @ v0.13.2: div_(world/sp)"},
    {"0.14.0", ScalingRule::kMean, "deepspeed/runtime/engine.py:2353,2355 @ v0.14.0: mul_(1/world(sdp group))",
     ScalingRule::kDs4530,
     "deepspeed/runtime/zero/stage_1_and_2.py:1107 (dense), 1067 (MoE) @ v0.14.0: div_(world/sp)"},
    {"0.14.4", ScalingRule::kDs4530,
     "deepspeed/runtime/engine.py:2412 (dp_world_size = world/sp) -> 2346,2348 @ v0.14.4", ScalingRule::kDs4530,
     "deepspeed/runtime/zero/stage_1_and_2.py:1112 (dense), 1072 (MoE) @ v0.14.4: div_(world/sp)"},
    {"0.14.5", ScalingRule::kDs4530,
     "deepspeed/runtime/engine.py:2456 (divisor world(sdp)/sp, PR #5555 since 0.14.3) -> 2392 @ v0.14.5",
     ScalingRule::kDs4530, "deepspeed/runtime/zero/stage_1_and_2.py:1118 @ v0.14.5: div_(world/sp)"},
    {"0.15.0", ScalingRule::kDs4530,
     "deepspeed/runtime/engine.py:2465 (dp_world_size = world/sp) -> 2399,2401 @ v0.15.0", ScalingRule::kDs4530,
     "deepspeed/runtime/zero/stage_1_and_2.py:1119 (dense), 1079 (MoE) @ v0.15.0: div_(world/sp)"},
    {"0.16.0", ScalingRule::kDs4530,
     "deepspeed/runtime/engine.py:2496 (dp_world_size = world/sp) -> 2430,2432 @ v0.16.0", ScalingRule::kDs4530,
     "deepspeed/runtime/zero/stage_1_and_2.py:1115 @ v0.16.0: div_(world/sp) on every bucket"},
    // ZeRO-3 measured on 0.19.8 (docs/ds5248.md): reduce-scatter divides by world, all-reduce by world/sp.
    {"0.19.8", ScalingRule::kDs4530, "deepspeed/runtime/engine.py:3884 (divisor world(sdp)/sp) -> 3815 @ v0.19.8",
     ScalingRule::kDs4530, "deepspeed/runtime/zero/stage_1_and_2.py:1688 @ v0.19.8: div_(world/sp)", "",
     ScalingRule::kMean, ScalingRule::kDs4530,
     "deepspeed/runtime/comm/coalesced_collectives.py:124 div_(world) (reduce-scatter path, stage3.py:1931); "
     "deepspeed/runtime/zero/stage3.py:1878 div_(world/sp) (all-reduce path) @ v0.19.8"},
}};

const VersionRow& Row(const std::string& version) {
  for (const auto& row : kVersions) {
    if (version == row.version) return row;
  }
  std::abort();  // only called with versions of the table above
}

// Effective divisor of the rule for a group of `g` ranks.
double RuleDivisor(ScalingRule rule, int g, int sp) {
  switch (rule) {
    case ScalingRule::kSum:
      return 1;
    case ScalingRule::kMean:
      return g;
    case ScalingRule::kDs4530:
    case ScalingRule::kDsPre4957:
      return static_cast<double>(g) / sp;
  }
  return 1;
}

}  // namespace

std::vector<std::string> KnownDeepSpeedVersions() {
  std::vector<std::string> v;
  for (const auto& row : kVersions) v.emplace_back(row.version);
  return v;
}

Expected<ScalingPolicy> ResolvePolicy(const std::string& name) {
  ScalingPolicy p;
  p.name = name;
  if (name == "sum") {
    p.engine = p.zero = ScalingRule::kSum;
    p.engine_cite = p.zero_cite = "no DeepSpeed counterpart: the raw sum over the group";
  } else if (name == "mean") {
    p.engine = p.zero = ScalingRule::kMean;
    p.engine_cite = Row("0.13.1").engine_cite;
    p.zero_cite = "plain data-parallel mean: div_(world(dp group)), as before sequence parallelism";
  } else if (name == "ds-4530") {
    p.engine = p.zero = ScalingRule::kDs4530;
    p.engine_cite = Row("0.14.4").engine_cite;
    p.zero_cite = Row("0.13.1").zero_cite;
  } else if (name == "ds-pre-4957") {
    // The double division only ever existed on the ZeRO reduce-scatter path;
    // the engine path is ds-4530's.
    p.engine = ScalingRule::kDs4530;
    p.zero = ScalingRule::kDsPre4957;
    p.engine_cite = Row("0.14.4").engine_cite;
    p.zero_cite = Row("0.12.6").zero_cite;
  } else if (name.rfind("deepspeed@", 0) == 0) {
    std::string v = name.substr(10);
    if (!v.empty() && v[0] == 'v') v = v.substr(1);
    for (const auto& row : kVersions) {
      if (v == row.version) {
        p.engine = row.engine;
        p.zero = row.zero;
        p.engine_cite = row.engine_cite;
        p.zero_cite = row.zero_cite;
        p.engine_unmodelled = row.engine_unmodelled;
        p.zero3_reduce_scatter = row.zero3_reduce_scatter;
        p.zero3_allreduce = row.zero3_allreduce;
        p.zero3_cite = row.zero3_cite;
        if (p.zero3_cite.empty()) p.zero3_unmodelled = "stage3.py of DeepSpeed " + v + " has not been read";
        return p;
      }
    }
    std::string known;
    for (const auto& k : KnownDeepSpeedVersions()) known += (known.empty() ? "" : ", ") + k;
    return Status::InvalidArgument("--scaling " + name + ": no table entry for DeepSpeed " + v + " (known: " + known +
                                   ")");
  } else {
    return Status::InvalidArgument("--scaling: unknown policy '" + name +
                                   "' (expected mean, sum, ds-4530, ds-pre-4957 or deepspeed@VERSION)");
  }
  // The named policies apply their ZeRO-1/2 rule on both stage-3 paths (no double division there).
  p.zero3_reduce_scatter = p.zero3_allreduce = p.zero == ScalingRule::kDsPre4957 ? ScalingRule::kDs4530 : p.zero;
  p.zero3_cite = "the ZeRO-1/2 rule on both stage-3 paths: " + p.zero_cite;
  return p;
}

double BucketScaling::Divisor() const {
  double d = 1;
  for (const auto* ops : {&pre, &post}) {
    for (const auto& op : *ops) d = op.divide ? d * op.value : d / op.value;
  }
  return d;
}

BucketScaling PlanBucketScaling(const ScalingPolicy& policy, const BucketContext& b) {
  BucketScaling s;
  const double f = b.predivide_factor;
  const int g = b.group_size;
  if (b.path == ReductionPath::kEngineAllreduce) {
    s.cite = policy.engine_cite;
    if (policy.engine == ScalingRule::kSum) return s;
    const double eff = RuleDivisor(policy.engine, g, b.sp);
    // engine.py allreduce_bucket: postscale_gradients() == !prescale_gradients.
    if (b.prescale) {
      s.pre.push_back({false, 1.0 / eff});
    } else {
      if (f != 1.0) s.pre.push_back({false, 1.0 / f});
      if (f != eff) s.post.push_back({false, f / eff});
    }
    return s;
  }
  if (b.path == ReductionPath::kZero3ReduceScatter || b.path == ReductionPath::kZero3Allreduce) {
    // Both divide the local bucket before the collective (coalesced_collectives.py:124,
    // stage3.py:1878); stage 3 refuses gradient_predivide_factor != 1 with reduce_scatter.
    s.cite = policy.zero3_cite;
    const ScalingRule rule =
        b.path == ReductionPath::kZero3ReduceScatter ? policy.zero3_reduce_scatter : policy.zero3_allreduce;
    if (rule != ScalingRule::kSum) s.pre.push_back({true, RuleDivisor(rule, g, b.sp)});
    return s;
  }
  s.cite = policy.zero_cite;
  if (policy.zero == ScalingRule::kSum) return s;
  const double eff = RuleDivisor(policy.zero, g, b.sp);
  if (!b.reduce_scatter) {
    // gradient_reduction_w_predivide: the postscale test compares the factor
    // with the full group size, not group/sp, so factor == group size skips
    // the post-multiply and leaves a divisor of `factor`.
    if (b.prescale) {
      s.pre.push_back({true, eff});
    } else {
      if (f != 1.0) s.pre.push_back({false, 1.0 / f});
      if (f != g) s.post.push_back({false, f / eff});
    }
    return s;
  }
  // average_tensor: one division per bucket (per parameter when the bucket
  // holds MoE parameters; same value, as experts are replicated here).
  // gradient_predivide_factor and prescale_gradients do not reach this path.
  s.pre.push_back({true, eff});
  if (policy.zero == ScalingRule::kDsPre4957 && b.has_moe) s.pre.push_back({true, eff});
  return s;
}

}  // namespace gradtrace::capture
