#include "reduction_path.h"

namespace gradtrace::semantics {

namespace {

constexpr struct {
  ReductionPath path;
  const char* name;
} kPathNames[] = {
    {ReductionPath::kEngineAllreduce, "engine"},
    {ReductionPath::kZeroPartitioned, "zero"},
    {ReductionPath::kZero3ReduceScatter, "zero3-reduce-scatter"},
    {ReductionPath::kZero3Allreduce, "zero3-allreduce"},
};

// A recorded boolean setting: "true" or "false"; anything else (or absent) is the default.
bool RecordedFlag(const pb::Config& c, const std::string& key, bool default_value) {
  const auto it = c.extra().find(key);
  if (it == c.extra().end()) return default_value;
  if (it->second == "true") return true;
  if (it->second == "false") return false;
  return default_value;
}

}  // namespace

ZeroSettings RecordedZeroSettings(const pb::Config& config) {
  ZeroSettings s;
  if (config.reduce_bucket_size() > 0) s.reduce_bucket_size = config.reduce_bucket_size();
  s.reduce_scatter = RecordedFlag(config, "zero_reduce_scatter", s.reduce_scatter);
  s.contiguous_gradients = RecordedFlag(config, "zero_contiguous_gradients", s.contiguous_gradients);
  return s;
}

ReductionPath ChooseReductionPath(int zero_stage, const ZeroSettings& s, int64_t bucket_elements) {
  if (zero_stage <= 0) return ReductionPath::kEngineAllreduce;
  if (zero_stage < 3) return ReductionPath::kZeroPartitioned;
  const bool allreduce = s.contiguous_gradients && bucket_elements <= s.reduce_bucket_size && !s.reduce_scatter;
  return allreduce ? ReductionPath::kZero3Allreduce : ReductionPath::kZero3ReduceScatter;
}

const char* ReductionPathName(ReductionPath path) {
  for (const auto& p : kPathNames) {
    if (p.path == path) return p.name;
  }
  return "unknown";
}

std::vector<std::string> ReductionPathNames() {
  std::vector<std::string> out;
  for (const auto& p : kPathNames) out.emplace_back(p.name);
  return out;
}

std::optional<ReductionPath> ParseReductionPath(const std::string& name) {
  for (const auto& p : kPathNames) {
    if (name == p.name) return p.path;
  }
  return std::nullopt;
}

}  // namespace gradtrace::semantics
