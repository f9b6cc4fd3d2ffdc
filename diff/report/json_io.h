// JSON through nlohmann::ordered_json (keys stay in the order written, so
// reports diff cleanly), and the pieces the report and the partial report share.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "gradtrace.pb.h"
#include "report/report.h"
#include "status.h"

namespace gradtrace::diff {

using Json = nlohmann::ordered_json;

// One style for every JSON file the tool writes: two-space indent, a final newline.
// Doubles print as the shortest decimal that reads back as the same double.
// Strings hold what traces, archives and paths hold, which need not be UTF-8
// (a directory named with byte 0xFF, a rename that cuts a character): each
// invalid byte is written as U+FFFD, the replacement character (REPORT_SCHEMA.md).
std::string DumpJson(const Json& j);

// Limits on JSON read from files (partial reports, an archive's pack.json),
// checked before parsing: arrays and objects nested deeper than this would
// recurse that deep in every later walk (50,000 levels overflowed the stack),
// and no string gradtrace writes comes near 1 MiB (one of 190 MB cost 1.37 GB).
inline constexpr int kMaxJsonDepth = 64;
inline constexpr size_t kMaxJsonString = size_t{1} << 20;

// Parses `text` after one pass over it (no allocation) that checks the limits
// above. InvalidArgument, for the caller to prefix with the file:
// "nested deeper than 64 arrays and objects (byte N)", "string longer than
// 1048576 bytes (byte N)", or "not JSON: <the parser's reason>".
Expected<Json> ParseJson(const std::string& text);

// A report number: null when undefined (NaN) or infinite, as REPORT_SCHEMA.md says.
Json NumberOrNull(double v);

// `c` in protobuf's JSON mapping (proto field names, every field, 64-bit
// integers as strings, enums by name), in the proto's field order.
Json ConfigToJson(const pb::Config& c);
// The inverse; InvalidArgument with protobuf's reason when `j` is not a Config.
Status ConfigFromJson(const Json& j, pb::Config* c);

// A whole report as --json writes it (json.cc).
Json ReportToJson(const Report& r);

// {"dir", "producer", "run_id", "world", "truncated", ...}; the config is separate.
Json TraceSideToJson(const TraceSide& s);

// One cell of a per-rank x per-bucket view (REPORT_SCHEMA.md, "Per-rank x per-bucket view"): NaN numbers and
// an unknown (0) expected divisor as null, so finite numbers read back exactly and null reads back as undefined.
Json BucketCellToJson(const BucketCell& c);

}  // namespace gradtrace::diff
