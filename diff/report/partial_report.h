// The partial report of one shard (gradtrace-diff A B --shard K/N --json FILE):
// the compare phase's Comparison as JSON, everything the judge needs, so that
// merging all N parts (merge.h) gives the single-process report exactly.
// Format: REPORT_SCHEMA.md, "Partial reports". Numbers that must survive the
// round trip bit for bit are written exactly: finite doubles as the shortest
// decimal that reads back as the same double, non-finite ones as the strings
// "NaN", "Infinity", "-Infinity" (protobuf's JSON convention).
#pragma once

#include <string>

#include "compare/diff_engine.h"
#include "status.h"

namespace gradtrace::diff {

std::string RenderPartialJson(const Comparison& c);

// Reads the partial report at `path`. Errors are one line starting "path: ":
// unreadable, not JSON (with the parser's position), not a partial report, an
// unknown major version, or a field missing or of the wrong type (named as
// "params[3].scale").
Expected<Comparison> ReadPartialJson(const std::string& path);

}  // namespace gradtrace::diff
