// libFuzzer target: the index. The input is the payload of an Index frame
// appended, with a correct checksum and footer, to a real trace's frames (the
// stats-mode sample trace: small frames, fast), so the fuzzer works on the
// entries rather than on the CRC. Loads the index, reads every frame it points
// at, then verifies the file (a scan compared with the index).
#include <cstddef>
#include <cstdint>

#include "format.h"
#include "fuzz_common.h"
#include "trace_reader.h"

using namespace gradtrace;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile* file = new fuzz::MemFile();
  const std::string& prefix = fuzz::SampleTracePrefix();
  const std::string payload(reinterpret_cast<const char*>(data), size);
  file->Set(prefix + fuzz::PlainFrame(static_cast<uint8_t>(format::FrameType::kIndex), payload) +
            fuzz::Footer(prefix.size()));
  Expected<std::unique_ptr<TraceReader>> opened = TraceReader::Open(file->path());
  if (!opened.ok()) fuzz::Fail("the sample trace does not open: " + opened.status().message());
  TraceReader& r = **opened;
  fuzz::CheckErrorLine(r.index_status(), file->path());
  Frame f;
  if (r.has_index()) {
    if (r.index().entries_size() > format::kMaxIndexEntries) fuzz::Fail("index above kMaxIndexEntries accepted");
    for (const pb::IndexEntry& e : r.index().entries()) {
      if (e.offset() < format::kFileHeaderSize || e.offset() >= prefix.size())
        fuzz::Fail("index entry outside the data");
      fuzz::CheckErrorLine(r.ReadAt(e.offset(), &f), file->path());
    }
  }
  // VerifyFile scans every frame and compares them with the index.
  fuzz::CheckErrorLine(VerifyFile(file->path()), file->path());
  return 0;
}
