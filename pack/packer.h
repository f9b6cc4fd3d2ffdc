// gradtrace-pack's work, without the command line: load the sets, write the
// archive (traces, the diff of the packed traces, environment, manifest,
// README, attachments) to a temporary sibling, and rename it into place once
// it is complete and under the limit -- re-encoding the traces first when the
// captured ones do not fit (fidelity.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "load/packed_run.h"
#include "status.h"

namespace gradtrace::pack {

struct PackOptions {
  std::vector<std::string> sets;  // one (a --self report) or two (A reference, B suspect)
  std::string output;             // the archive to write
  uint64_t limit = 25'000'000;
  std::vector<std::string> attachments;
  diff::PackedDiff diff;  // the comparison to run and record
  int threads = 0;
  std::vector<std::string> argv;  // for environment.json
};

struct PackResult {
  uint64_t archive_bytes = 0;
  uint64_t captured_bytes = 0;      // trace files as captured
  uint64_t packed_trace_bytes = 0;  // trace members
  size_t members = 0;
  bool reencoded = false;
  int attempts = 0;
  std::string headline;  // the packed report's
  int diff_exit = 0;
};

// Errors are one line naming the file; the output is then untouched.
Expected<PackResult> Pack(const PackOptions& options);

}  // namespace gradtrace::pack
