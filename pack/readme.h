// README.md of a bug-report archive: what is inside, what fidelity each
// parameter kept, and the commands that rerun the comparison.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fidelity.h"

namespace gradtrace::pack {

struct ReadmeFacts {
  std::string archive;               // file name of the archive, as the rerun commands name it
  std::vector<std::string> sources;  // per set (a, then b): where it came from
  std::string mode;                  // "diff" or "self"
  std::string diff_options;          // e.g. "--phase post --rtol 0.001", or ""
  std::string headline;              // the packed report's one line
  int exit_code = 0;
  uint64_t captured_bytes = 0;      // the trace files as captured
  uint64_t packed_trace_bytes = 0;  // the trace members
  uint64_t limit = 0;
  std::vector<Choice> fidelity;  // empty: every trace byte for byte as captured
  std::vector<std::string> attachments;
  bool original_report = false;  // original-report.json is present
  bool compressed_json = false;  // the reports' JSON is stored as report.json.zst (report_member.h)
};

// The README lists this many parameters' fidelity at most (the worst first, as planned); pack.json lists all.
inline constexpr size_t kReadmeFidelityRows = 100;

std::string RenderReadme(const ReadmeFacts& f);

}  // namespace gradtrace::pack
