#include "rank_file.h"

#include <climits>
#include <cstdio>

namespace gradtrace {
namespace {

constexpr std::string_view kPrefix = "rank-";
constexpr std::string_view kSuffix = ".gtrace";
constexpr size_t kMinDigits = 5;

bool ClaimsRankFile(std::string_view name) {
  return name.size() >= kPrefix.size() + kSuffix.size() && name.substr(0, kPrefix.size()) == kPrefix &&
         name.substr(name.size() - kSuffix.size()) == kSuffix;
}

}  // namespace

std::string RankFileName(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "rank-%05d.gtrace", rank);
  return buf;
}

std::optional<int> ParseRankFileName(std::string_view name) {
  if (!ClaimsRankFile(name)) return std::nullopt;
  const std::string_view digits = name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  // %05d pads to five digits and never beyond: a longer number has no leading zero.
  if (digits.size() < kMinDigits || (digits.size() > kMinDigits && digits[0] == '0')) return std::nullopt;
  long long rank = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    rank = rank * 10 + (c - '0');
    if (rank > INT_MAX) return std::nullopt;
  }
  return static_cast<int>(rank);
}

Expected<std::optional<int>> RankFileMember(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string_view name = std::string_view(path).substr(slash == std::string::npos ? 0 : slash + 1);
  if (auto rank = ParseRankFileName(name)) return std::optional<int>(*rank);
  if (!ClaimsRankFile(name)) return std::optional<int>();
  return Status::InvalidArgument(path + ": not a rank file name: a trace set's files are named " +
                                 std::string(kRankFilePattern) +
                                 " (the rank zero-padded to five digits, as every writer names them)");
}

}  // namespace gradtrace
