// ParallelFor: the one place diff/ starts threads. Work items are claimed from
// an atomic counter, so uneven items (one huge parameter, many small ones)
// still keep every thread busy.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace gradtrace::diff {

// Threads to use when the caller asked for `requested` (0 = all cores).
inline int ResolveThreads(int requested) {
  if (requested > 0) return requested;
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

// Calls fn(item, worker) for every item in [0, n) on up to `threads` threads;
// `worker` in [0, threads) lets callers keep per-thread state (open readers).
// fn must not throw. Returns after every call has returned.
inline void ParallelFor(size_t n, int threads, const std::function<void(size_t item, int worker)>& fn) {
  int t = std::max(1, std::min<int>(threads, static_cast<int>(n)));
  if (t <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  pool.reserve(t);
  for (int w = 0; w < t; ++w) {
    pool.emplace_back([&, w] {
      for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i, w);
    });
  }
  for (auto& th : pool) th.join();
}

// An item's share of the work in SplitBlocks and ParallelForBlocks: a weight below 1 counts as 1.
inline int64_t ItemWeight(int64_t weight) { return std::max<int64_t>(weight, 1); }

// Cuts items [0, weight.size()) into `blocks` contiguous runs of about equal
// total weight (ItemWeight), none empty while there are items enough:
// [begin, end) per block, in order.
inline std::vector<std::pair<size_t, size_t>> SplitBlocks(const std::vector<int64_t>& weight, int blocks) {
  const size_t n = weight.size();
  int64_t total = 0;
  for (int64_t w : weight) total += ItemWeight(w);
  std::vector<std::pair<size_t, size_t>> out;
  size_t i = 0;
  int64_t seen = 0;
  for (int b = 0; b < blocks; ++b) {
    const size_t begin = i;
    const int64_t until = total * (b + 1) / blocks;  // the end of the b-th share
    // One item for each block after this one that can have one.
    const size_t reserve =
        static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(blocks, static_cast<int64_t>(n)) - 1 - b));
    while (i < n && (b == blocks - 1 || ((i == begin || seen < until) && n - i > reserve))) {
      seen += ItemWeight(weight[i]);
      ++i;
    }
    out.emplace_back(begin, i);
  }
  return out;
}

// ParallelFor for items whose neighbours share work (per-thread caches): each
// thread works through its own block of SplitBlocks in order, even blocks
// front to back and odd ones back to front, so that the threads of two
// neighbouring blocks end at their cut, where the work they share is, rather
// than one starting there and the other ending there (the thread that
// finishes first takes the rest of the other's block from that end, on with
// what it holds). A thread whose block is done takes items from the block with
// the most weight left, at the end its owner is walking towards, so uneven
// items still keep every thread busy.
inline void ParallelForBlocks(const std::vector<int64_t>& weight, int threads,
                              const std::function<void(size_t item, int worker)>& fn) {
  const size_t n = weight.size();
  const int t = std::max(1, std::min<int>(threads, static_cast<int>(n)));
  if (t <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  struct Block {
    size_t front = 0, back = 0;  // items [front, back) not yet claimed
    int64_t left = 0;            // their weight
    bool backwards = false;      // its owner takes them from the back
  };
  std::vector<Block> blocks;
  for (auto [begin, end] : SplitBlocks(weight, t)) {
    Block b{begin, end, 0, blocks.size() % 2 == 1};
    for (size_t i = begin; i < end; ++i) b.left += ItemWeight(weight[i]);
    blocks.push_back(b);
  }
  std::mutex mu;
  auto claim = [&](int worker, size_t* item) {
    std::lock_guard<std::mutex> lock(mu);
    Block* from = &blocks[worker];
    bool own = true;
    if (from->front >= from->back) {
      own = false;
      from = nullptr;
      for (Block& b : blocks) {
        if (b.front < b.back && (from == nullptr || b.left > from->left)) from = &b;
      }
      if (from == nullptr) return false;
    }
    *item = own == from->backwards ? --from->back : from->front++;  // the owner's end, or a thief's: the other
    from->left -= ItemWeight(weight[*item]);
    return true;
  };
  std::vector<std::thread> pool;
  pool.reserve(t);
  for (int w = 0; w < t; ++w) {
    pool.emplace_back([&, w] {
      for (size_t item = 0; claim(w, &item);) fn(item, w);
    });
  }
  for (auto& th : pool) th.join();
}

}  // namespace gradtrace::diff
