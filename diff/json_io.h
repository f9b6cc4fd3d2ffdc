// JSON through nlohmann::ordered_json (keys stay in the order written, so
// reports diff cleanly), and the pieces the report and the partial report share.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "gradtrace.pb.h"
#include "report.h"
#include "status.h"

namespace gradtrace::diff {

using Json = nlohmann::ordered_json;

// One style for every JSON file the tool writes: two-space indent, a final newline.
// Doubles print as the shortest decimal that reads back as the same double.
std::string DumpJson(const Json& j);

// A report number: null when undefined (NaN) or infinite, as REPORT_SCHEMA.md says.
Json NumberOrNull(double v);

// `c` in protobuf's JSON mapping (proto field names, every field, 64-bit
// integers as strings, enums by name), in the proto's field order.
Json ConfigToJson(const pb::Config& c);
// The inverse; InvalidArgument with protobuf's reason when `j` is not a Config.
Status ConfigFromJson(const Json& j, pb::Config* c);

// A whole report as --json writes it (report_json.cc).
Json ReportToJson(const Report& r);

// {"dir", "producer", "run_id", "world", "truncated", ...}; the config is separate.
Json TraceSideToJson(const TraceSide& s);

// One cell of a per-rank x per-bucket view (REPORT_SCHEMA.md, "Per-rank x per-bucket view"): NaN numbers and
// an unknown (0) expected divisor as null, so finite numbers read back exactly and null reads back as undefined.
Json BucketCellToJson(const BucketCell& c);

}  // namespace gradtrace::diff
