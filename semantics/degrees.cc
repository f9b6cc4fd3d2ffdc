#include "degrees.h"

#include <algorithm>

namespace gradtrace::semantics {

namespace {
int Or1(int v) { return std::max(1, v); }
}  // namespace

Degrees DegreesOf(const pb::Config& c) {
  Degrees d;
  d.dp = Or1(c.dp());
  d.sp = Or1(c.sp());
  d.cp = Or1(c.cp());
  d.tp = Or1(c.tp());
  d.pp = Or1(c.pp());
  d.ep = Or1(c.ep_size());
  d.gas = Or1(c.gas());
  d.replicate = Or1(c.replicate());
  d.world = c.world() > 0 ? c.world() : d.dp * d.sp * d.cp * d.tp * d.pp;
  // edp not recorded: the dense data-parallel ranks (dp x sp x cp) shared among ep.
  d.edp = c.edp() > 0 ? c.edp() : std::max(1, d.dp * d.split() / d.ep);
  return d;
}

const std::vector<Degree>& ConfigDegrees() {
  static const std::vector<Degree> kDegrees = {
      {Dimension::kSp, [](const pb::Config& c) { return double(c.sp()); }},
      {Dimension::kCp, [](const pb::Config& c) { return double(c.cp()); }},
      {Dimension::kDp, [](const pb::Config& c) { return double(c.dp()); }},
      {Dimension::kTp, [](const pb::Config& c) { return double(c.tp()); }},
      {Dimension::kReplicate, [](const pb::Config& c) { return double(c.replicate()); }},
      {Dimension::kWorld, [](const pb::Config& c) { return double(c.world()); }},
      {Dimension::kGas, [](const pb::Config& c) { return double(c.gas()); }},
      {Dimension::kPpMicrobatches, [](const pb::Config& c) { return double(c.pp_microbatches()); }},
      {Dimension::kPredivide, [](const pb::Config& c) { return c.gradient_predivide_factor(); }},
      {Dimension::kEp, [](const pb::Config& c) { return double(c.ep_size()); }},
      {Dimension::kEdp, [](const pb::Config& c) { return double(c.edp()); }},
      {Dimension::kExperts, [](const pb::Config& c) { return double(c.moe_experts()); }},
  };
  return kDegrees;
}

int DegreeRank(Dimension dim) {
  const auto& all = ConfigDegrees();
  for (size_t i = 0; i < all.size(); ++i) {
    if (dim == all[i].dim) return static_cast<int>(i) + 1;
  }
  return dim == Dimension::kOne ? 0 : static_cast<int>(all.size()) + 1;
}

}  // namespace gradtrace::semantics
