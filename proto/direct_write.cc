#include "direct_write.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

namespace gradtrace {

DirectWrites::~DirectWrites() {
  Disable();
  std::free(buffer_);
}

void DirectWrites::Open(int fd) {
  Disable();
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return;
  // The same file, not the same path: a path may name another file by now.
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  fd_ = ::open(self.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
}

void DirectWrites::Disable() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

char* DirectWrites::Place(uint64_t at, size_t n) {
  if (!enabled()) return nullptr;
  const size_t skew = static_cast<size_t>(at % kBlock);
  if (skew + n > capacity_) {
    std::free(buffer_);
    capacity_ = (skew + n + kBlock - 1) / kBlock * kBlock;
    if (::posix_memalign(reinterpret_cast<void**>(&buffer_), kBlock, capacity_) != 0) {
      buffer_ = nullptr;
      capacity_ = 0;
      return nullptr;
    }
  }
  placed_at_ = at;
  placed_ = buffer_ + skew;
  return placed_;
}

DirectWrites::Middle DirectWrites::MiddleOf(uint64_t at, size_t n) {
  Middle m;
  m.lo = (at + kBlock - 1) / kBlock * kBlock;
  m.hi = (at + n) / kBlock * kBlock;
  if (m.hi < m.lo + kMinimum) m.hi = m.lo;
  return m;
}

int DirectWrites::Write(Middle m) {
  const char* from = placed_ + (m.lo - placed_at_);
  for (uint64_t at = m.lo; at < m.hi;) {
    const ssize_t w = ::pwrite(fd_, from + (at - m.lo), m.hi - at, static_cast<off_t>(at));
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return ENOSPC;
    if (w % static_cast<ssize_t>(kBlock) != 0) return EIO;  // the rest would start unaligned
    at += static_cast<uint64_t>(w);
  }
  return 0;
}

}  // namespace gradtrace
