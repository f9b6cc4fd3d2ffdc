#include "report/atomic_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace gradtrace::diff {

namespace {

// Writes `content` to `file`; errors name `path` (what the user asked for).
Status WriteWhole(const std::string& file, const std::string& path, const std::string& content) {
  std::FILE* f = std::fopen(file.c_str(), "wb");
  if (f == nullptr) return Status::IoError(path + ": cannot create: " + std::strerror(errno));
  bool ok = std::fwrite(content.data(), 1, content.size(), f) == content.size();
  ok = (std::fflush(f) == 0) && ok;
  int err = errno;
  ok = (std::fclose(f) == 0) && ok;
  return ok ? Status::Ok() : Status::IoError(path + ": write failed: " + std::strerror(err));
}

}  // namespace

Status WriteFileAtomic(const std::string& path, const std::string& content) {
  // Regression: `--json /dev/null` run as root renamed a regular file over /dev/null.
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) return WriteWhole(path, path, content);
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  if (Status s = WriteWhole(tmp, path, content); !s.ok()) {
    std::remove(tmp.c_str());
    return s;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return Status::IoError(path + ": cannot rename into place: " + std::strerror(err));
  }
  return Status::Ok();
}

}  // namespace gradtrace::diff
