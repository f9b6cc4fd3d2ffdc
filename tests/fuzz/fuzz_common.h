// Shared by the libFuzzer targets and the seed-corpus generator: one small
// model, sample traces written by the real writer in each capture mode, and an
// in-memory file the reader can open by path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "gradtrace.pb.h"
#include "slice_codec.h"
#include "status.h"

namespace gradtrace::fuzz {

// Six parameters covering every dtype, a scalar and an empty tensor.
pb::RunInfo FuzzRun();

// Writes a trace of FuzzRun(): two steps, each a StepInfo and one bucket
// record per phase holding a slice of every parameter (the first one cut in
// two), in `mode`. With `index` false the writer stops without index and footer.
// `rank`: 0 or 1 of the two-rank run (a trace set needs both).
Status WriteSampleTrace(const std::string& path, const CaptureMode& mode, bool index, int rank = 0);

// The bytes of the stats-mode sample trace up to its index: the fixed prefix
// that fuzz_index appends index frames to.
const std::string& SampleTracePrefix();

// A memfd opened by path (/proc/self/fd/N): a regular file without disk I/O.
class MemFile {
 public:
  MemFile();
  ~MemFile();
  void Set(const uint8_t* data, size_t size);
  void Set(const std::string& bytes) { Set(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()); }
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// A frame with a correct checksum (codec none) and a footer pointing at `index_offset`.
std::string PlainFrame(uint8_t type, const std::string& payload);
std::string Footer(uint64_t index_offset);

// Findings the sanitizers cannot see: a broken invariant of the codec. Prints
// `what` and aborts, so libFuzzer saves the input as a crash.
[[noreturn]] void Fail(const std::string& what);
// Every error of a reader is one line naming the file and an offset.
// For errors above the codec (the diff): one line that mentions `needle` (a file or directory).
void CheckErrorNaming(const Status& s, const std::string& needle);
void CheckErrorLine(const Status& s, const std::string& path);
// A message without a location (from validate.h, parse_limits.h) is one line.
void CheckOneLine(const Status& s);

}  // namespace gradtrace::fuzz
