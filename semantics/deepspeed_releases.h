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

// The DeepSpeed changes the explanations cite (factor_finding.h,
// divisor_finding.h name one only for DeepSpeed traces; the diff's sentences
// take the numbers and releases from here). Not rows of the table above: a
// change is cited for the releases on either side of it, and a release that
// only shows a bug (0.18.3) is not emulated.
enum class DeepSpeedChange {
  kPr4530,          // ZeRO-1/2 divides by dp (group size / sp), not dp x sp
  kPr4957,          // ZeRO-1/2 no longer divides MoE buckets twice
  kPrs5259And6546,  // expert gradients divided by dp, not averaged over their edp group
  kIssue7749,       // 0.18.3 divides by gas once more (gas^2) in a forward-output hook
};

struct DeepSpeedChangeRow {
  DeepSpeedChange change;
  std::string ref;     // as cited: "#4530", "#5259/#6546"
  std::string first;   // the first release with the change or with the fix ("" not known)
  std::string broken;  // a regression: the release that has it ("0.18.3"), else ""
  std::string cite;    // where it was read
};

const DeepSpeedChangeRow& DeepSpeedChangeOf(DeepSpeedChange change);

// Whether a release ("0.13.1" or "v0.13.1") has the change (or its fix): it
// is the row's `first` or later. False when `first` is not known.
bool HasDeepSpeedChange(const std::string& version, DeepSpeedChange change);
bool HasPr4530(const std::string& version);  // first in 0.11.2
bool HasPr4957(const std::string& version);  // first in 0.13.1

}  // namespace gradtrace::semantics
