// The file names of a trace set (FORMAT.md 2): one file per rank, "rank-", the
// rank in decimal zero-padded to at least five digits, ".gtrace":
// rank-00003.gtrace, rank-99999.gtrace, rank-100000.gtrace. Every writer and
// every lister of a set (gradtrace-train, the Python recorders through
// _gtcodec, the diff, gradtrace-inspect, the packer, the tests) uses these.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "status.h"

namespace gradtrace {

// How messages name the rule.
inline constexpr char kRankFilePattern[] = "rank-NNNNN.gtrace";

// The name of rank `rank`'s file; `rank` >= 0.
std::string RankFileName(int rank);

// The rank whose file `name` (a file name, no directory) is: exactly the names
// RankFileName writes, so each rank has one spelling. Empty for anything else,
// rank-3.gtrace, rank-000003.gtrace and a rank beyond int included.
std::optional<int> ParseRankFileName(std::string_view name);

// A lister's verdict on the file `path` (its last component is the name): its
// rank; empty for a file that is no part of a trace set (not named
// rank-*.gtrace); InvalidArgument naming `path` for a rank-*.gtrace that
// RankFileName would not write, so that a misnamed rank is reported instead of
// silently left out.
Expected<std::optional<int>> RankFileMember(const std::string& path);

}  // namespace gradtrace
