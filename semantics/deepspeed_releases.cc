#include "deepspeed_releases.h"

#include <cassert>

namespace gradtrace::semantics {

namespace {

// One row per DeepSpeed release read (pip download deepspeed==X --no-deps).
// Line numbers are those of the released sdist at that version.
// The engine divides by the size of the sequence-data-parallel group
// (dp*sp) until 0.14.0, and by that size / sp from 0.14.x on
// (_reduce_non_expert_gradients passes dp_world_size). ZeRO-1/2 divides by
// dp_process_group size / sp (the sdp group when sp > 1) in every release
// read; 0.12.6 also passes divide=self.ipg_bucket_has_moe_params to
// allreduce_bucket, dividing MoE buckets twice — PR #4957 made it
// divide=False (first released in 0.13.1).
const std::vector<DeepSpeedRelease> kReleases = {

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
    // ZeRO-3 measured on 0.19.8 (docs/studies/ds5248.md): reduce-scatter divides by world, all-reduce by world/sp.
    {"0.19.8", ScalingRule::kDs4530, "deepspeed/runtime/engine.py:3884 (divisor world(sdp)/sp) -> 3815 @ v0.19.8",
     ScalingRule::kDs4530, "deepspeed/runtime/zero/stage_1_and_2.py:1688 @ v0.19.8: div_(world/sp)", "",
     ScalingRule::kMean, ScalingRule::kDs4530,
     "deepspeed/runtime/comm/coalesced_collectives.py:124 div_(world) (reduce-scatter path, stage3.py:1931); "
     "deepspeed/runtime/zero/stage3.py:1878 div_(world/sp) (all-reduce path) @ v0.19.8"},
};

// One row per DeepSpeedChange, in the enum's order.
const std::vector<DeepSpeedChangeRow> kChanges = {
    {DeepSpeedChange::kPr4530, "#4530", "0.11.2", "",
     "deepspeed/runtime/zero/stage_1_and_2.py:1030 @ v0.11.2: div_(world(dp group)/sp); not in v0.11.1"},
    {DeepSpeedChange::kPr4957, "#4957", "0.13.1", "",
     "deepspeed/runtime/zero/stage_1_and_2.py:1112,1119 @ v0.13.1: divide=False (v0.12.6 and v0.13.0 divide "
     "MoE buckets again in allreduce_bucket: the rows above)"},
    {DeepSpeedChange::kPrs5259And6546, "#5259/#6546", "", "",
     "not read at a release tag; rendered in plain PyTorch by the bug zoo (tests/zoo/cases.py rows 4 and 5)"},
    {DeepSpeedChange::kIssue7749, "#7749", "0.18.4", "0.18.3",
     "deepspeed/runtime/engine.py:2238-2240, 2359-2360 @ v0.18.3 (53e91a098, PR #7665: a hook on the forward's "
     "output divides by gas); fixed by d568375e5 (PR #7724), engine.py:2362-2366 @ v0.18.4; measured in "
     "docs/studies/deepspeed-versions.md"},
};

// "0.12.6" -> {0, 12, 6}; missing parts 0.
std::vector<int> VersionParts(const std::string& v) {
  std::vector<int> parts;
  int cur = 0;
  bool any = false;
  for (char ch : v) {
    if (ch >= '0' && ch <= '9') {
      cur = cur * 10 + (ch - '0');
      any = true;
    } else if (ch == '.') {
      parts.push_back(cur);
      cur = 0;
    } else {
      break;
    }
  }
  if (any) parts.push_back(cur);
  while (parts.size() < 3) parts.push_back(0);
  return parts;
}

std::string Bare(const std::string& v) { return !v.empty() && v[0] == 'v' ? v.substr(1) : v; }

}  // namespace

const std::vector<DeepSpeedRelease>& DeepSpeedReleases() { return kReleases; }

const DeepSpeedRelease* FindDeepSpeedRelease(const std::string& version) {
  const std::string v = Bare(version);
  for (const auto& row : kReleases) {
    if (v == row.version) return &row;
  }
  return nullptr;
}

std::vector<std::string> KnownDeepSpeedVersions() {
  std::vector<std::string> v;
  for (const auto& row : kReleases) v.push_back(row.version);
  return v;
}

const DeepSpeedChangeRow& DeepSpeedChangeOf(DeepSpeedChange change) {
  const DeepSpeedChangeRow& row = kChanges.at(static_cast<size_t>(change));
  assert(row.change == change);  // one row per change, in the enum's order
  return row;
}

bool HasDeepSpeedChange(const std::string& version, DeepSpeedChange change) {
  const std::string& first = DeepSpeedChangeOf(change).first;
  return !first.empty() && VersionParts(Bare(version)) >= VersionParts(first);
}

bool HasPr4530(const std::string& version) { return HasDeepSpeedChange(version, DeepSpeedChange::kPr4530); }
bool HasPr4957(const std::string& version) { return HasDeepSpeedChange(version, DeepSpeedChange::kPr4957); }

}  // namespace gradtrace::semantics
