// The c10d process groups of a dp x sp job (layout: topology.h). Every rank
// constructs only the groups it belongs to, in the same order on every rank:
// world, then SP groups, then DP groups, each rendezvousing under its own
// store prefix ("sp/1", "dp/0").
#pragma once

#include <chrono>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "topology.h"

namespace gradtrace::capture {

struct NamedGroup {
  std::string name;        // "world", "sp", "dp", "sdp", "edp"
  std::vector<int> ranks;  // global ranks, in group-rank order
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
};

struct Groups {
  Topology topo;
  at::Device device = at::kCPU;        // where tensors live for this backend
  NamedGroup world, sp, dp, sdp, edp;  // sdp and edp share world's pg (all ranks)
  std::chrono::milliseconds timeout{60000};
};

// Throws c10::Error (from c10d) on rendezvous failure or timeout.
Groups CreateGroups(const c10::intrusive_ptr<c10d::Store>& store, const Topology& topo, const std::string& backend,
                    std::chrono::milliseconds timeout, int local_rank);

// A gloo group of `ranks` (global ranks, `rank` among them) under the store prefix `name`, whatever the
// training's backend: the live guard's exchange of host bytes (guard_sink.h). Collective, like CreateGroups.
NamedGroup CreateGlooGroup(const c10::intrusive_ptr<c10d::Store>& store, const std::string& name,
                           const std::vector<int>& ranks, int rank, std::chrono::milliseconds timeout);

// Blocking helpers; each waits for completion (and thus throws on timeout).
void AllReduceSum(const NamedGroup& g, at::Tensor& t);
void Broadcast(const NamedGroup& g, at::Tensor& t, int root_group_rank);

}  // namespace gradtrace::capture
