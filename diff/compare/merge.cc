#include "compare/merge.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include "report/partial_report.h"

namespace gradtrace::diff {
namespace {

std::string ShardName(const Shard& s) { return std::to_string(s.k) + "/" + std::to_string(s.n); }

// Checks that `parts` are the N shards of one diff, each once, none missing; returns shard k -> index
// into parts. Sized by the parts given, never by a count read from a file (regression, issue 20:
// shard.n = 2^31-1 aborted with bad_alloc).
Expected<std::map<int, int>> ShardOwners(const std::vector<Comparison>& parts, const std::vector<std::string>& paths,
                                         const std::string& given) {
  const Comparison& first = parts[0];
  const int n = first.shard.n;
  std::map<int, int> owner;
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
    if (auto it = owner.find(p.shard.k); it != owner.end()) {
      return Status::InvalidArgument(paths[i] + ": shard " + ShardName(p.shard) + " given twice (also " +
                                     paths[it->second] + ")");
    }
    owner[p.shard.k] = static_cast<int>(i);
  }
  for (int k = 0; k < n; ++k) {  // stops at the first shard missing, at most parts.size() in
    if (owner.count(k) > 0) continue;
    return Status::InvalidArgument("--merge: shard " + ShardName({k, n}) + " missing (parts given: " + given + ")");
  }
  return owner;
}

// Moves the parameters of shards 1..N-1 into `merged` (shard 0's part, whose own are already there), in
// index order, refusing an index out of range, in two parts or in none.
Status CollectParams(std::vector<Comparison>& parts, const std::map<int, int>& owner,
                     const std::vector<std::string>& paths, const std::string& given, Comparison* merged) {
  // Parameter index -> index into parts, as above never sized by param_count (1e9 aborted with bad_alloc).
  size_t given_params = merged->params.size();
  for (const Comparison& part : parts) given_params += part.params.size();
  std::unordered_map<size_t, int> from;
  from.reserve(given_params);
  auto take = [&](const Comparison& part, int i) -> Status {
    for (const ComparedParam& p : part.params) {
      if (p.index >= merged->param_count) {
        return Status::InvalidArgument(paths[i] + ": parameter index " + std::to_string(p.index) + " ('" + p.name +
                                       "') beyond param_count " + std::to_string(merged->param_count));
      }
      if (auto it = from.find(p.index); it != from.end()) {
        return Status::InvalidArgument(paths[i] + ": parameter '" + p.name + "' (index " + std::to_string(p.index) +
                                       ") also in " + paths[it->second]);
      }
      from[p.index] = i;
    }
    return Status();
  };
  GT_RETURN_IF_ERROR(take(*merged, owner.at(0)));
  for (int k = 1; k < merged->shard.n; ++k) {
    Comparison& part = parts[owner.at(k)];
    GT_RETURN_IF_ERROR(take(part, owner.at(k)));
    std::move(part.params.begin(), part.params.end(), std::back_inserter(merged->params));
  }
  // Every index is below param_count and in one part only: when fewer than param_count, the first missing is
  // at most given_params.
  for (size_t index = 0; index < merged->param_count; ++index) {
    if (from.count(index) == 0) {
      return Status::InvalidArgument("--merge: parameter index " + std::to_string(index) + " of " +
                                     std::to_string(merged->param_count) + " is in no part (parts given: " + given +
                                     ")");
    }
  }
  std::sort(merged->params.begin(), merged->params.end(),
            [](const ComparedParam& x, const ComparedParam& y) { return x.index < y.index; });
  return Status::Ok();
}

}  // namespace

Expected<Comparison> MergeParts(const std::vector<std::string>& paths, bool bucket_view) {
  if (paths.empty()) return Status::InvalidArgument("--merge: no partial reports given");
  std::vector<Comparison> parts;
  for (const auto& path : paths) {
    auto part = ReadPartialJson(path);
    if (!part.ok()) return part.status();
    parts.push_back(std::move(*part));
  }
  std::string given;  // for errors no single file is to blame for
  for (const auto& path : paths) given += (given.empty() ? "" : ", ") + path;
  auto owner = ShardOwners(parts, paths, given);
  if (!owner.ok()) return owner.status();
  // Side B's reduction evidence comes from the shard that measured it (diff_engine.cc DescribeSides); a part
  // written before that split carries it in every shard, the same.
  std::vector<ReductionEvidence> b_reductions = parts[owner->at(EvidenceShardB(parts[0].shard.n))].b.reductions;
  Comparison merged = std::move(parts[owner->at(0)]);
  merged.b.reductions = std::move(b_reductions);
  GT_RETURN_IF_ERROR(CollectParams(parts, *owner, paths, given, &merged));
  merged.shard = Shard{};
  if (!bucket_view) merged.a.bucket_view.clear(), merged.b.bucket_view.clear();
  return merged;
}

}  // namespace gradtrace::diff
