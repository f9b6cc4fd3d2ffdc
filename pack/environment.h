// environment.json of a bug-report archive: per trace set, what produced it
// and where (framework and version, the RunInfo `versions` map -- torch,
// CUDA, NCCL, python --, producer, configuration, host, world), and how the
// pack itself was made. Schema: docs/user/bug-report.md, "environment.json".
#pragma once

#include <string>
#include <vector>

#include "load/trace_set.h"
#include "report/json_io.h"

namespace gradtrace::pack {

struct PackedSet {
  std::string name;    // "a" or "b"
  std::string source;  // as given on the command line
  const diff::TraceSet* set = nullptr;
};

// The whole document; `argv` is the pack's command line.
diff::Json EnvironmentJson(const std::vector<PackedSet>& sets, const std::vector<std::string>& argv,
                           int64_t created_unix);

}  // namespace gradtrace::pack
