#include "explain/step_words.h"

namespace gradtrace::diff {
namespace {

// At most this many parameter names in a sentence; the rest are counted.
constexpr size_t kNamesShown = 4;

std::string Ranks(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

}  // namespace

std::string NonfiniteWords(const pb::RunInfo& run, const NonfiniteRecord& r) {
  std::string where = r.phase == "FINAL" ? "FINAL (what the optimizer received)"
                                         : r.phase + " of bucket " + std::to_string(r.bucket) + " (group " + r.group +
                                               ", micro-step " + std::to_string(r.micro) + ")";
  std::string names;
  for (size_t i = 0; i < r.params.size() && i < kNamesShown; ++i) {
    const int32_t id = r.params[i];
    const std::string name = id >= 0 && id < run.params_size() ? run.params(id).name() : "#" + std::to_string(id);
    names += (i ? ", '" : "'") + name + "'";
  }
  if (r.params.size() > kNamesShown) names += " and " + std::to_string(r.params.size() - kNamesShown) + " more";
  return "NaN or Inf in " + where + " on rank " + std::to_string(r.rank) + ": " + names;
}

std::string SkippedStepWords(const std::vector<int>& ranks, int64_t step) {
  return Ranks(ranks) + " did not step the optimizer in step " + std::to_string(step) +
         " while the other ranks did (e.g. a GradScaler that found inf/NaN there alone): from here the replicas "
         "hold different weights";
}

}  // namespace gradtrace::diff
