// --shard K/N: one of N processes compares a deterministic share of the
// aligned parameters. Every process sees the same parameter table, so every
// process computes the same partition without talking to the others.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "status.h"

namespace gradtrace::diff {

struct Shard {
  int k = 0;  // this process's share, 0 <= k < n
  int n = 1;  // n == 1: the whole diff
};

// Parses "K/N" (decimal, 0 <= K < N, N >= 1). InvalidArgument naming the text otherwise.
Expected<Shard> ParseShard(const std::string& text);

// The indexes (ascending) of the items in `shard`, from a partition that
// balances the summed weights: items in decreasing weight (ties: lower index
// first) each go to the least-loaded share (ties: lower k). The largest share
// exceeds the smallest by at most the largest weight.
std::vector<size_t> ShardItems(const std::vector<int64_t>& weights, Shard shard);

// The shard that measures side B's reduction evidence in a sharded FINAL diff
// (side A's: shard 0), so two shards share that fixed cost; the merge takes it
// from there.
inline int EvidenceShardB(int n) { return n > 1 ? 1 : 0; }

// 16 hex digits of FNV-1a 64 over `text`: the identity of a diff's inputs
// (partial reports of different diffs are refused on it; not a security check).
std::string Fingerprint(const std::string& text);

}  // namespace gradtrace::diff
