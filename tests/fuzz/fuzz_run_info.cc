// libFuzzer target: a RunInfo payload, parsed with the limits and validated
// as the reader does. A RunInfo that passes must be usable: its fingerprint
// and sketch positions computed, and written and read back by the real codec.
#include <cstddef>
#include <cstdint>

#include "fuzz_common.h"
#include "parse_limits.h"
#include "slice_codec.h"
#include "trace_reader.h"
#include "trace_writer.h"
#include "validate.h"

using namespace gradtrace;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile* file = new fuzz::MemFile();
  pb::RunInfo run;
  const std::string payload(reinterpret_cast<const char*>(data), size);
  if (Status s = ParseBounded(payload, ParseLimitsFor(format::FrameType::kRunInfo), &run); !s.ok()) {
    fuzz::CheckOneLine(s);
    return 0;
  }
  if (Status s = ValidateRunInfo(run); !s.ok()) {
    fuzz::CheckOneLine(s);
    return 0;
  }
  const std::string fingerprint = ModelFingerprint(run);
  for (int i = 0; i < run.params_size() && i < 8; ++i) {
    const std::vector<int64_t> pos = SketchPositions(run.params(i).name(), run.params(i).numel(), 4);
    for (size_t j = 0; j < pos.size(); ++j) {
      if (pos[j] < 0 || pos[j] >= run.params(i).numel() || (j > 0 && pos[j] <= pos[j - 1])) {
        fuzz::Fail("sketch positions out of range or order");
      }
    }
  }
  // Round trip through a file (index included): what validates, the writer writes and the reader reads back.
  {
    WriterOptions options;
    options.overwrite = true;  // the same memfd every input
    Expected<std::unique_ptr<TraceWriter>> w = TraceWriter::Open(file->path(), run, options);
    if (!w.ok()) fuzz::Fail("the writer refuses a valid RunInfo: " + w.status().message());
    if (Status s = (*w)->Close(); !s.ok()) fuzz::Fail("close failed: " + s.message());
  }
  Expected<std::unique_ptr<TraceReader>> r = TraceReader::Open(file->path());
  if (!r.ok()) fuzz::Fail("a written RunInfo does not read back: " + r.status().message());
  if ((*r)->run_info().params_size() != run.params_size()) fuzz::Fail("params lost in the round trip");
  // The writer fills in an empty fingerprint and keeps a given one.
  const std::string& want = run.model_fingerprint().empty() ? fingerprint : run.model_fingerprint();
  if ((*r)->run_info().model_fingerprint() != want) fuzz::Fail("fingerprint changed in the round trip");
  if (Status s = VerifyFile(file->path()); !s.ok()) fuzz::Fail("a written file does not verify: " + s.message());
  return 0;
}
