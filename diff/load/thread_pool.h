// ParallelFor: the one place diff/ starts threads. Work items are claimed from
// an atomic counter, so uneven items (one huge parameter, many small ones)
// still keep every thread busy.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <functional>
#include <thread>
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

}  // namespace gradtrace::diff
