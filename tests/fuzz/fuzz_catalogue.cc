// libFuzzer target: the diff's catalogue from a format 1.1 index (issue 12).
// As fuzz_index, the input is the payload of the Index frame of a real trace
// (the stats-mode sample), so the fuzzer works on the catalogue entries: param
// ids, groups, partitions, divisors, offsets. The file is loaded as a trace set
// (TraceSet::Load builds the catalogue from the index without reading data
// frames), diffed against itself in every phase (whole and windowed) and
// self-checked: frames the catalogue names are then read by offset, so every
// lie it tells must end in a one-line error, never a crash.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "compare/diff_engine.h"
#include "evidence/self_check.h"
#include "format.h"
#include "fuzz_common.h"
#include "load/trace_set.h"
#include "rank_file.h"

using namespace gradtrace;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile* file = new fuzz::MemFile();
  // The sample run's two ranks as a trace set: rank 0 links to the in-memory
  // file with the fuzzed index, rank 1 is the real trace.
  static const std::string* dir = [] {
    auto* d = new std::string(
        (std::filesystem::temp_directory_path() / ("gradtrace-fuzz-catalogue-" + std::to_string(::getpid()))).string());
    std::filesystem::remove_all(*d);
    std::filesystem::create_directories(*d);
    std::filesystem::create_symlink(file->path(), *d + "/" + RankFileName(0));
    CaptureMode stats;
    stats.kind = CaptureMode::Kind::kStats;
    if (!fuzz::WriteSampleTrace(*d + "/" + RankFileName(1), stats, true, 1).ok()) fuzz::Fail("cannot write rank 1");
    return d;
  }();
  const std::string& prefix = fuzz::SampleTracePrefix();
  const std::string payload(reinterpret_cast<const char*>(data), size);
  file->Set(prefix + fuzz::PlainFrame(static_cast<uint8_t>(format::FrameType::kIndex), payload) +
            fuzz::Footer(prefix.size()));
  diff::LoadOptions lo;
  lo.threads = 1;
  auto set = diff::TraceSet::Load(*dir, lo);
  if (!set.ok()) {
    fuzz::CheckErrorNaming(set.status(), *dir);
    return 0;
  }
  for (pb::Phase phase : {pb::FINAL, pb::POST_REDUCE, pb::PRE_REDUCE}) {
    // Whole parameters, and windows of 7 elements (issue 24 item 2: the windowed gather follows the same lies).
    for (int64_t window : {int64_t{0}, int64_t{7}}) {
      diff::DiffOptions o;
      o.phase = phase;
      o.threads = 1;
      o.window_elements = window;
      auto r = diff::DiffSets(*set, *set, o);
      if (!r.ok()) fuzz::CheckErrorNaming(r.status(), *dir);
    }
  }
  diff::SelfOptions so;
  so.threads = 1;
  auto self = diff::RunSelfCheck(*dir, so);
  if (!self.ok()) fuzz::CheckErrorNaming(self.status(), *dir);
  return 0;
}
