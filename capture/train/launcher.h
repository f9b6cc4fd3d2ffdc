// Joining a job: from torchrun-style or SLURM environment variables, or as
// the local launcher (--nproc) that starts N ranks of this binary. No LibTorch.
#pragma once

#include <string>
#include <vector>

#include "status.h"

namespace gradtrace::capture {

struct DistEnv {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string source;  // "torchrun", "slurm" or "standalone"
};

// torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)
// win over SLURM's (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, with
// MASTER_ADDR from the environment or the first host of SLURM_JOB_NODELIST and
// MASTER_PORT from the environment or 29500 + SLURM_JOB_ID % 1000). With
// neither: a one-rank "standalone" job on a free local port. Malformed
// values: InvalidArgument naming the variable.
Expected<DistEnv> DistEnvFromEnvironment();

// The first host of a SLURM node list: "node[03-05,7],gpu1" -> "node03".
std::string FirstSlurmHost(const std::string& nodelist);

// A TCP port on 127.0.0.1 that was free a moment ago.
int FindFreePort();

// Starts `nproc` copies of `exe args...` with RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT, and forwards
// each line of their stdout/stderr prefixed "[rank N] ". When a rank exits
// non-zero or is killed, the others get SIGTERM (SIGKILL after a grace
// period) and the launcher returns non-zero. Returns 0 when every rank exits 0.
int LaunchLocal(int nproc, const std::string& exe, const std::vector<std::string>& args);

}  // namespace gradtrace::capture
