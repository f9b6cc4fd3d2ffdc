// What gradtrace-diff needs to rerun the comparison packed in a bug-report
// archive (gradtrace-pack): the manifest member pack.json names the mode and
// the diff options the pack ran with. `gradtrace-diff bug.gtpack` reads it and
// runs the same diff on the archive's sets, reproducing its report.json.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "json_io.h"
#include "status.h"

namespace gradtrace::diff {

inline constexpr char kPackManifest[] = "pack.json";
inline constexpr char kPackFormat[] = "gtpack 1";
// Trace-set names inside an archive: A (the reference, or the only set) and B.
inline constexpr char kPackSetA[] = "a";
inline constexpr char kPackSetB[] = "b";

// The comparison as the pack ran it (its command line's diff options).
struct PackedDiff {
  std::string mode = "diff";  // "diff" (a vs b) or "self" (a alone)
  std::string phase = "final";
  std::optional<int64_t> step;
  std::optional<double> rtol;
  std::vector<std::string> renames;
};

Json PackedDiffToJson(const PackedDiff& d);
// Reads pack.json's "diff" object from the archive at `archive_path`. Errors
// are one line naming the archive and member.
Expected<PackedDiff> ReadPackedDiff(const std::string& archive_path);

}  // namespace gradtrace::diff
