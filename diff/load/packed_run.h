// What gradtrace-diff needs to rerun the comparison packed in a bug-report
// archive (gradtrace-pack): the manifest member pack.json names the mode and
// the diff options the pack ran with. `gradtrace-diff bug.gtpack` reads it and
// runs the same diff on the archive's sets, reproducing its report.json.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "report/json_io.h"
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

// Where diff options come from, which decides how an error spells them.
enum class OptionSource {
  kCommandLine,  // gradtrace-diff's or gradtrace-pack's: --phase, --step, --rtol, --rename
  kPackJson,     // an archive's pack.json: diff.phase, diff.step, diff.rtol, diff.renames[i]
};

// The one check of the diff options, wherever they come from, so that a
// packed archive cannot ask for what the command line refuses (issue 20): mode
// "diff" or "self"; phase "final", "post" or "pre"; step >= 0; rtol a positive
// finite number; each rename rule one ParseRenameRule accepts; a self check
// only phase "final" and no rename rule. InvalidArgument, one line naming the
// option as `source` spells it and the value refused.
Status ValidateDiffOptions(const PackedDiff& d, OptionSource source);

Json PackedDiffToJson(const PackedDiff& d);
// Reads pack.json's "diff" object from the archive at `archive_path` and
// checks it with ValidateDiffOptions. Errors are one line naming the archive
// and member.
Expected<PackedDiff> ReadPackedDiff(const std::string& archive_path);

}  // namespace gradtrace::diff
