#include "topology.h"

namespace gradtrace::capture {

std::vector<int> Topology::SpGroup(int dp_index) const {
  std::vector<int> r;
  for (int s = 0; s < sp; ++s) r.push_back(dp_index * sp + s);
  return r;
}

std::vector<int> Topology::DpGroup(int sp_index) const {
  std::vector<int> r;
  for (int d = 0; d < dp; ++d) r.push_back(d * sp + sp_index);
  return r;
}

std::vector<int> Topology::AllRanks() const {
  std::vector<int> r;
  for (int i = 0; i < world(); ++i) r.push_back(i);
  return r;
}

}  // namespace gradtrace::capture
