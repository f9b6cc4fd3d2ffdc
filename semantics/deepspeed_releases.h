// THE table of modelled DeepSpeed releases: for each, the scaling rule of each
// reduction path and the file:line at that release tag its arithmetic copies.
// capture (--scaling deepspeed@X), the diff's explanations and the Python
// repro tools (_gtcodec.deepspeed_releases()) all read this one list.
#pragma once

#include <string>
#include <vector>

#include "scaling_rule.h"

namespace gradtrace::semantics {

struct DeepSpeedRelease {
  std::string version;  // "0.13.1"
  ScalingRule engine;   // ZeRO stage 0: DeepSpeedEngine.allreduce_bucket
  std::string engine_cite;
  ScalingRule zero;  // ZeRO-1/2: average_tensor / gradient_reduction_w_predivide
  std::string zero_cite;
  // Non-empty: the release's stage-0 path reduces over another group than the
  // emulation's (sdp), so stage 0 with sp > 1 is refused for it.
  std::string engine_unmodelled = "";
  // ZeRO-3 (stage3.py): the two paths' rules; zero3_cite empty: stage3.py of
  // this release was not read, so stage 3 is refused for it.
  ScalingRule zero3_reduce_scatter = ScalingRule::kMean;
  ScalingRule zero3_allreduce = ScalingRule::kDs4530;
  std::string zero3_cite = "";
};

// Oldest first.
const std::vector<DeepSpeedRelease>& DeepSpeedReleases();
// "0.13.1" or "v0.13.1"; null when the table has no such release.
const DeepSpeedRelease* FindDeepSpeedRelease(const std::string& version);
std::vector<std::string> KnownDeepSpeedVersions();

// The DeepSpeed history that applies to a release, for explanations:
// PR #4530 (ZeRO-1/2 divides by dp, not dp x sp; first in 0.11.2) and
// PR #4957 (MoE buckets no longer divided twice; first in 0.13.1).
bool HasPr4530(const std::string& version);
bool HasPr4957(const std::string& version);

}  // namespace gradtrace::semantics
