#include "process_groups.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef USE_C10D_NCCL
#include <c10/cuda/CUDAFunctions.h>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>

namespace gradtrace::capture {

namespace {

c10::intrusive_ptr<c10d::ProcessGroup> MakeGroup(const c10::intrusive_ptr<c10d::Store>& base, const std::string& prefix,
                                                 int group_rank, int group_size, const std::string& backend,
                                                 std::chrono::milliseconds timeout) {
  auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, base);
  // Since torch 2.x a ProcessGroup dispatches to per-device Backends.
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, group_rank, group_size);
  if (backend == "nccl") {
#ifdef USE_C10D_NCCL
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, group_rank, group_size, opts);
    pg->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
    pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
    return pg;
#else
    TORCH_CHECK(false, "this build has no NCCL support (configure with -DGRADTRACE_CUDA=ON)");
#endif
  }
  auto opts = c10d::ProcessGroupGloo::Options::create();
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  opts->timeout = timeout;
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, group_rank, group_size, opts);
  pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
  return pg;
}

int IndexOf(const std::vector<int>& v, int x) { return static_cast<int>(std::find(v.begin(), v.end(), x) - v.begin()); }

}  // namespace

NamedGroup CreateGlooGroup(const c10::intrusive_ptr<c10d::Store>& store, const std::string& name,
                           const std::vector<int>& ranks, int rank, std::chrono::milliseconds timeout) {
  NamedGroup g;
  g.name = name;
  g.ranks = ranks;
  g.pg = MakeGroup(store, name, IndexOf(ranks, rank), static_cast<int>(ranks.size()), "gloo", timeout);
  return g;
}

Groups CreateGroups(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo, const std::string& backend,
                    std::chrono::milliseconds timeout, int local_rank) {
  Groups g;
  g.topo = topo;
  g.timeout = timeout;
  if (backend == "nccl") {
#ifdef USE_C10D_NCCL
    // One GPU per local rank; NCCL communicators bind to the current device.
    TORCH_CHECK(local_rank < c10::cuda::device_count(), "LOCAL_RANK ", local_rank, " but only ",
                static_cast<int>(c10::cuda::device_count()), " CUDA device(s)");
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(local_rank));
#endif
    g.device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
  }

  g.world.name = "world";
  g.world.ranks = topo.AllRanks();
  g.world.pg = MakeGroup(store, "world", topo.rank, topo.world(), backend, timeout);

  // Members of SP group d are exactly the ranks with dp_rank d; constructing
  // only our own group is safe because each group has its own store prefix.
  g.sp.name = "sp";
  g.sp.ranks = topo.SpGroup(topo.dp_rank());
  g.sp.pg = topo.sp == 1 ? nullptr
                         : MakeGroup(store, "sp/" + std::to_string(topo.dp_rank()), IndexOf(g.sp.ranks, topo.rank),
                                     topo.sp, backend, timeout);
  g.dp.name = "dp";
  g.dp.ranks = topo.DpGroup(topo.sp_rank());
  g.dp.pg = topo.dp == 1 ? nullptr
                         : MakeGroup(store, "dp/" + std::to_string(topo.sp_rank()), IndexOf(g.dp.ranks, topo.rank),
                                     topo.dp, backend, timeout);
  g.sdp = g.world;
  g.sdp.name = "sdp";
  g.edp = g.world;
  g.edp.name = "edp";
  return g;
}

void AllReduceSum(const NamedGroup& g, at::Tensor& t) {
  if (g.ranks.size() <= 1) return;
  std::vector<at::Tensor> v{t};
  g.pg->allreduce(v)->wait();
}

void Broadcast(const NamedGroup& g, at::Tensor& t, int root_group_rank) {
  if (g.ranks.size() <= 1) return;
  std::vector<at::Tensor> v{t};
  c10d::BroadcastOptions opts;
  opts.rootRank = root_group_rank;
  g.pg->broadcast(v, opts)->wait();
}

}  // namespace gradtrace::capture
