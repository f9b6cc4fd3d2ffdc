#include "regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

namespace gradtrace {
namespace {

const char* KindOf(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "of an unknown type";
}

}  // namespace

Expected<std::FILE*> OpenRegularFile(const std::string& path, const std::string& name) {
  const std::string& shown = name.empty() ? path : name;
  // O_NONBLOCK: open() of a FIFO returns at once instead of waiting for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return Status::IoError(shown + ": cannot open: " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::IoError(shown + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::IoError(shown + ": not a regular file (" + KindOf(st.st_mode) + ")");
  }
  // Reads of a regular file never block; clear the flag anyway so the FILE behaves as fopen's.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  std::FILE* f = ::fdopen(fd, "rb");
  if (f == nullptr) {
    const int err = errno;
    ::close(fd);
    return Status::IoError(shown + ": cannot open: " + std::strerror(err));
  }
  return f;
}

Expected<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes, const std::string& name) {
  const std::string& shown = name.empty() ? path : name;
  auto opened = OpenRegularFile(path, name);
  if (!opened.ok()) return opened.status();
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(*opened, &std::fclose);
  struct stat st;
  if (::fstat(::fileno(f.get()), &st) != 0) return Status::IoError(shown + ": cannot stat: " + std::strerror(errno));
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    return Status::LimitExceeded(shown + ": " + std::to_string(size) + " bytes, more than the limit of " +
                                 std::to_string(max_bytes));
  }
  std::string out(size, '\0');
  if (size > 0 && std::fread(out.data(), 1, out.size(), f.get()) != out.size()) {
    return Status::IoError(shown + ": read failed (file changed while reading?)");
  }
  return out;
}

}  // namespace gradtrace
