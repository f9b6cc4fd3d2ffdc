#include "merge.h"

#include <algorithm>

#include "partial_report.h"

namespace gradtrace::diff {
namespace {

std::string ShardName(const Shard& s) { return std::to_string(s.k) + "/" + std::to_string(s.n); }

}  // namespace

Expected<Comparison> MergeParts(const std::vector<std::string>& paths, bool bucket_view) {
  if (paths.empty()) return Status::InvalidArgument("--merge: no partial reports given");
  std::vector<Comparison> parts;
  for (const auto& path : paths) {
    auto part = ReadPartialJson(path);
    if (!part.ok()) return part.status();
    parts.push_back(std::move(*part));
  }
  const Comparison& first = parts[0];
  int n = first.shard.n;
  std::vector<int> owner(n, -1);  // shard k -> index into parts
  for (size_t i = 0; i < parts.size(); ++i) {
    const Comparison& p = parts[i];
    if (p.fingerprint != first.fingerprint) {
      return Status::InvalidArgument(paths[i] + ": a part of a different diff (inputs fingerprint " + p.fingerprint +
                                     ", " + paths[0] + " has " + first.fingerprint + ")");
    }
    if (p.shard.n != n) {
      return Status::InvalidArgument(paths[i] + ": shard " + ShardName(p.shard) + ", but " + paths[0] + " is shard " +
                                     ShardName(first.shard) + " (all parts must come from one N)");
    }
    if (owner[p.shard.k] >= 0) {
      return Status::InvalidArgument(paths[i] + ": shard " + ShardName(p.shard) + " given twice (also " +
                                     paths[owner[p.shard.k]] + ")");
    }
    owner[p.shard.k] = static_cast<int>(i);
  }
  std::string given;  // for errors no single file is to blame for
  for (const auto& path : paths) given += (given.empty() ? "" : ", ") + path;
  for (int k = 0; k < n; ++k) {
    if (owner[k] >= 0) continue;
    return Status::InvalidArgument("--merge: shard " + ShardName({k, n}) + " missing (parts given: " + given + ")");
  }

  Comparison merged = std::move(parts[owner[0]]);
  std::vector<int> from(merged.param_count, -1);  // parameter index -> index into parts
  auto take = [&](Comparison& part, int i) -> Status {
    for (const ComparedParam& p : part.params) {
      if (p.index >= merged.param_count) {
        return Status::InvalidArgument(paths[i] + ": parameter index " + std::to_string(p.index) + " ('" + p.name +
                                       "') beyond param_count " + std::to_string(merged.param_count));
      }
      if (from[p.index] >= 0) {
        return Status::InvalidArgument(paths[i] + ": parameter '" + p.name + "' (index " + std::to_string(p.index) +
                                       ") also in " + paths[from[p.index]]);
      }
      from[p.index] = i;
    }
    return Status();
  };
  GT_RETURN_IF_ERROR(take(merged, owner[0]));
  for (int k = 1; k < n; ++k) {
    Comparison& part = parts[owner[k]];
    GT_RETURN_IF_ERROR(take(part, owner[k]));
    std::move(part.params.begin(), part.params.end(), std::back_inserter(merged.params));
  }
  for (size_t index = 0; index < from.size(); ++index) {
    if (from[index] < 0) {
      return Status::InvalidArgument("--merge: parameter index " + std::to_string(index) + " of " +
                                     std::to_string(merged.param_count) + " is in no part (parts given: " + given +
                                     ")");
    }
  }
  std::sort(merged.params.begin(), merged.params.end(),
            [](const ComparedParam& x, const ComparedParam& y) { return x.index < y.index; });
  merged.shard = Shard{};
  if (!bucket_view) merged.a.bucket_view.clear(), merged.b.bucket_view.clear();
  return merged;
}

}  // namespace gradtrace::diff
