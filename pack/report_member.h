// How a report's JSON goes into the archive. Every parameter is in it (a
// person's reports show the worst; diff/report/rows.h), so at 100,000
// parameters report.json alone was 65 MB and the pack could not fit its
// default 25 MB limit although the traces did (issue 42). A JSON report past
// kPlainJsonBytes is stored zstd-compressed as NAME.zst (about 40 times
// smaller: its keys repeat per parameter); `zstd -d` or any zstd library
// restores the bytes `gradtrace-diff ARCHIVE --json F` writes.
#pragma once

#include <cstddef>
#include <string>

#include "status.h"

namespace gradtrace::pack {

inline constexpr size_t kPlainJsonBytes = size_t{4} << 20;

struct JsonMember {
  std::string name;   // NAME, or NAME.zst when compressed
  std::string bytes;  // the JSON, or its zstd frame
};

// `json` as the archive member for `name` ("report.json").
Expected<JsonMember> ReportJsonMember(const std::string& name, std::string json);

}  // namespace gradtrace::pack
