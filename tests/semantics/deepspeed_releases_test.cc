// The DeepSpeed change table the explanations cite (semantics/deepspeed_releases.h),
// against the release table the emulation reads.
#include "deepspeed_releases.h"

#include <gtest/gtest.h>

namespace gradtrace::semantics {
namespace {

TEST(DeepSpeedChanges, OneRowPerChange) {
  for (DeepSpeedChange c : {DeepSpeedChange::kPr4530, DeepSpeedChange::kPr4957, DeepSpeedChange::kPrs5259And6546,
                            DeepSpeedChange::kIssue7749}) {
    const DeepSpeedChangeRow& row = DeepSpeedChangeOf(c);
    EXPECT_EQ(row.change, c);
    EXPECT_EQ(row.ref.front(), '#') << row.ref;
    EXPECT_FALSE(row.cite.empty()) << row.ref;
  }
}

TEST(DeepSpeedChanges, ReleasesOnEitherSide) {
  EXPECT_FALSE(HasPr4530("0.11.1"));
  EXPECT_TRUE(HasPr4530("0.11.2"));
  EXPECT_TRUE(HasPr4530("v0.19.8"));
  EXPECT_FALSE(HasPr4957("0.13.0"));
  EXPECT_TRUE(HasPr4957("0.13.1"));
  // DeepSpeed #7749: 0.18.3 divides by gas twice (an output hook from PR #7665), 0.18.4 does not (PR #7724).
  const DeepSpeedChangeRow& gas = DeepSpeedChangeOf(DeepSpeedChange::kIssue7749);
  EXPECT_EQ(gas.broken, "0.18.3");
  EXPECT_EQ(gas.first, "0.18.4");
  EXPECT_FALSE(HasDeepSpeedChange("0.18.3", DeepSpeedChange::kIssue7749));
  EXPECT_TRUE(HasDeepSpeedChange("0.18.4", DeepSpeedChange::kIssue7749));
  // No release read for #5259/#6546: no release is said to have it.
  EXPECT_FALSE(HasDeepSpeedChange("0.19.8", DeepSpeedChange::kPrs5259And6546));
}

// The change table and the release table tell one history: ZeRO-1/2 divides by group / sp from the first
// release with PR #4530, and no release with PR #4957 divides MoE buckets twice (0.12.6 and 0.13.0 do).
TEST(DeepSpeedChanges, AgreeWithTheReleaseTable) {
  for (const DeepSpeedRelease& r : DeepSpeedReleases()) {
    EXPECT_EQ(r.zero != ScalingRule::kMean, HasPr4530(r.version)) << r.version;
    if (r.version == "0.12.6" || r.version == "0.13.0") {
      EXPECT_EQ(r.zero, ScalingRule::kDsPre4957) << r.version;
    }
    if (HasPr4957(r.version)) {
      EXPECT_NE(r.zero, ScalingRule::kDsPre4957) << r.version;
    }
  }
}

}  // namespace
}  // namespace gradtrace::semantics
