#include "dist_harness.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <thread>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <vector>

namespace gradtrace::capture::testing {

::testing::AssertionResult RunRanks(int dp, int sp, const RankBody& body, int timeout_s) {
  static int counter = 0;
  const int world = dp * sp;
  const std::string store_path = (std::filesystem::temp_directory_path() /
                                  ("gt-dist-" + std::to_string(getpid()) + "-" + std::to_string(counter++)))
                                     .string();
  std::filesystem::remove(store_path);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int code = 0;
      try {
        at::set_num_threads(1);
        auto store = c10::make_intrusive<c10d::FileStore>(store_path, world);
        Groups g = CreateGroups(store, Topology{dp, sp, r}, "gloo", std::chrono::seconds(10), 0);
        std::string failure = body(g);
        if (!failure.empty()) {
          std::fprintf(stderr, "[rank %d] %s\n", r, failure.c_str());
          code = 1;
        }
        // Keep every rank alive until all are done with the groups.
        if (world > 1) g.world.pg->barrier()->wait();
      } catch (const std::exception& e) {
        std::string what = e.what();
        std::fprintf(stderr, "[rank %d] exception: %s\n", r, what.substr(0, what.find('\n')).c_str());
        code = 2;
      }
      std::fflush(stderr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  std::vector<int> status(world, -1);
  int remaining = world;
  while (remaining > 0) {
    for (int r = 0; r < world; ++r) {
      if (status[r] != -1) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        status[r] = st;
        --remaining;
      }
    }
    if (remaining > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < world; ++r) {
        if (status[r] == -1) kill(pids[r], SIGKILL);
      }
      for (int r = 0; r < world; ++r) {
        if (status[r] == -1) waitpid(pids[r], &status[r], 0);
      }
      std::filesystem::remove(store_path);
      return ::testing::AssertionFailure() << "ranks did not finish within " << timeout_s << " s";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::filesystem::remove(store_path);
  for (int r = 0; r < world; ++r) {
    if (!WIFEXITED(status[r]) || WEXITSTATUS(status[r]) != 0) {
      return ::testing::AssertionFailure()
             << "rank " << r << " failed (status " << status[r] << "); see its stderr above";
    }
  }
  return ::testing::AssertionSuccess();
}

double RelErr(const at::Tensor& a, const at::Tensor& b) {
  const double nb = b.to(at::kDouble).norm().item<double>();
  const double nd = (a.to(at::kDouble) - b.to(at::kDouble)).norm().item<double>();
  if (nb == 0) return nd == 0 ? 0 : std::numeric_limits<double>::infinity();
  return nd / nb;
}

}  // namespace gradtrace::capture::testing
