// libFuzzer target: gradtrace-diff --merge's reader (issues 12 and 20). The
// input is one or more partial reports (JSON, as `--shard K/N --json` writes
// them), separated by a line "--part--"; seeds are real parts of diffs of the
// sample traces, alone and all N together. They go through what
// `gradtrace-diff --merge PART... [--html]` runs: MergeParts (the JSON parse
// with its nesting and size limits, the schema and the checks across parts),
// then the judge and every renderer. Inputs of odd length merge as --html
// does, keeping shard 0's bucket views. Bad input must end in a one-line error
// naming a file given, never a crash, a hang or memory out of proportion.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "compare/diff_engine.h"
#include "compare/merge.h"
#include "fuzz_common.h"
#include "report/report.h"

using namespace gradtrace;

namespace {

constexpr std::string_view kSeparator = "\n--part--\n";
constexpr size_t kMaxParts = 4;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static auto* files = new std::vector<fuzz::MemFile>(kMaxParts);
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> paths;
  for (size_t start = 0; paths.size() < kMaxParts;) {
    const size_t end = paths.size() + 1 < kMaxParts ? input.find(kSeparator, start) : std::string_view::npos;
    const std::string_view part = input.substr(start, end == std::string_view::npos ? end : end - start);
    (*files)[paths.size()].Set(reinterpret_cast<const uint8_t*>(part.data()), part.size());
    paths.push_back((*files)[paths.size()].path());
    if (end == std::string_view::npos) break;
    start = end + kSeparator.size();
  }
  const bool html = size % 2 == 1;
  auto merged = diff::MergeParts(paths, html);
  if (!merged.ok()) {
    // A message names the file at fault, or every file given (a shard or parameter no part holds).
    for (const std::string& p : paths) {
      if (merged.status().message().find(p) != std::string::npos) {
        fuzz::CheckErrorNaming(merged.status(), p);
        return 0;
      }
    }
    fuzz::Fail("merge error names no part given: " + merged.status().message());
  }
  auto report = diff::JudgeComparison(*merged);
  if (!report.ok()) {
    fuzz::CheckOneLine(report.status());
    return 0;
  }
  // The renderers must cope with whatever the judge accepted.
  (void)diff::RenderJson(*report);
  (void)diff::RenderMarkdown(*report);
  (void)diff::RenderHtml(*report);
  (void)diff::RenderText(*report, false);
  return 0;
}
