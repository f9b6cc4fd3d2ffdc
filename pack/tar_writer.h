// Writes a ustar archive (archive.h) front to back: members are appended as
// they come, each header then data padded to a block, and Finish() adds the
// two zero blocks that end it. Errors name the file being written.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "archive.h"
#include "status.h"
#include "trace_reader.h"

namespace gradtrace::pack {

class TarWriter {
 public:
  // Creates (truncating) `path`; messages name `shown` (the output the user asked for).
  static Expected<std::unique_ptr<TarWriter>> Create(const std::string& path, const std::string& shown, int64_t mtime);
  ~TarWriter();

  Status Add(const std::string& name, const std::string& content);
  // Copies `source` (a file, or a window of one) as member `name`, calling
  // `progress(bytes copied)` every few MiB.
  Status AddCopy(const std::string& name, const TraceSource& source, const std::function<void(uint64_t)>& progress);
  // Flushes what is written so far (to read members back before Finish()).
  Status Flush();
  // The end-of-archive blocks, flush, fsync and close.
  Status Finish();

  uint64_t size() const { return offset_; }
  const std::vector<ArchiveMember>& members() const { return members_; }

 private:
  TarWriter() = default;
  Status Write(const void* data, size_t n);
  Status Header(const std::string& name, uint64_t size);

  std::FILE* file_ = nullptr;
  std::string shown_;
  int64_t mtime_ = 0;
  uint64_t offset_ = 0;
  std::vector<ArchiveMember> members_;
};

}  // namespace gradtrace::pack
