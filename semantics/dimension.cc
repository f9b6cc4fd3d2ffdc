#include "dimension.h"

#include <array>
#include <utility>

namespace gradtrace::semantics {
namespace {

constexpr std::array<std::pair<Dimension, const char*>, 15> kNames = {{
    {Dimension::kNone, ""},
    {Dimension::kOne, "one"},
    {Dimension::kSp, "sp"},
    {Dimension::kCp, "cp"},
    {Dimension::kSpCp, "sp x cp"},
    {Dimension::kDp, "dp"},
    {Dimension::kTp, "tp"},
    {Dimension::kReplicate, "replicate"},
    {Dimension::kWorld, "world"},
    {Dimension::kGas, "gas"},
    {Dimension::kPpMicrobatches, "pp_microbatches"},
    {Dimension::kPredivide, "predivide"},
    {Dimension::kEp, "ep"},
    {Dimension::kEdp, "edp"},
    {Dimension::kExperts, "experts"},
}};

}  // namespace

const char* DimensionName(Dimension d) {
  for (const auto& [dim, name] : kNames) {
    if (dim == d) return name;
  }
  return "";
}

std::optional<Dimension> DimensionNamed(std::string_view name) {
  for (const auto& [dim, n] : kNames) {
    if (name == n) return dim;
  }
  return std::nullopt;
}

bool IsSplit(Dimension d) { return d == Dimension::kSp || d == Dimension::kCp || d == Dimension::kSpCp; }

}  // namespace gradtrace::semantics
