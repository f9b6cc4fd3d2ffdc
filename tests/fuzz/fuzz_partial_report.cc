// libFuzzer target: gradtrace-diff --merge's reader (issue 12). The input is
// one partial report (JSON, as `--shard K/N --json` writes it; seeds are real
// parts of a diff of the sample traces). MergeParts reads and checks it; when
// it is accepted, the judge runs and every renderer formats the result. Bad
// input must end in a one-line error naming the file, never a crash.
#include <cstddef>
#include <cstdint>

#include "diff_engine.h"
#include "fuzz_common.h"
#include "merge.h"
#include "report.h"

using namespace gradtrace;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile* file = new fuzz::MemFile();
  file->Set(data, size);
  auto merged = diff::MergeParts({file->path()});
  if (!merged.ok()) {
    fuzz::CheckErrorNaming(merged.status(), file->path());
    return 0;
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
