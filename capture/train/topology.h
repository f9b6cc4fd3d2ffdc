// Rank layout of a dp x sp job (DESIGN.md, "Capture semantics"): which global
// ranks form each process group. Pure arithmetic, no LibTorch.
//
//   rank = dp_rank * sp + sp_rank
//   SP group d  = {d*sp, ..., d*sp + sp-1}        consecutive ranks
//   DP group s  = {s, s+sp, ..., s+(dp-1)*sp}     strided ranks
//   SDP group   = all ranks (gradients are reduced over it, as DeepSpeed's
//                 sequence-data-parallel group)
//   EDP group   = expert-data-parallel; experts are replicated on every rank
//                 (expert-parallel size 1), so it holds all ranks as well.
#pragma once

#include <string>
#include <vector>

namespace gradtrace::capture {

struct Topology {
  int dp = 1;
  int sp = 1;
  int rank = 0;

  int world() const { return dp * sp; }
  int dp_rank() const { return rank / sp; }
  int sp_rank() const { return rank % sp; }

  std::vector<int> SpGroup(int dp_index) const;  // members of SP group `dp_index`
  std::vector<int> DpGroup(int sp_index) const;  // members of DP group `sp_index`
  std::vector<int> AllRanks() const;
};

}  // namespace gradtrace::capture
