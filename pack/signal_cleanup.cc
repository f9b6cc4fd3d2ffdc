#include "signal_cleanup.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>

namespace gradtrace::pack {
namespace {

constexpr int kSlots = 8;
constexpr size_t kMaxPath = 4096;
constexpr int kMaxDepth = 4;  // X.gtpack.reencode.PID/a/rank-NNNNN.gtrace is two
constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};

// A slot is written only while kClaimed and read by the handler only while kReady, so the handler never sees
// a path half written. Lock-free atomics are async-signal-safe.
enum SlotState : int { kFree, kClaimed, kReady };
struct Slot {
  std::atomic<int> state{kFree};
  char path[kMaxPath];
};
Slot slots[kSlots];
std::atomic<bool> installed{false};

bool IsDotOrDotDot(const char* name) {
  return name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'));
}

// Removes `name` under `dirfd`: a file or link, or a directory with what it holds down to `depth` more levels.
// Only async-signal-safe calls (getdents64 is a bare system call). True when `name` is gone.
bool RemoveAt(int dirfd, const char* name, int depth) {
  if (::unlinkat(dirfd, name, 0) == 0) return true;
  if (errno == ENOENT) return true;
  if (errno != EISDIR || depth == 0) return false;  // Linux: unlink of a directory is EISDIR
  const int fd = ::openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  alignas(8) char buf[2048];
  // Entries removed while reading move the directory's offsets: read it again from the start until a pass
  // removes nothing (what is left then cannot be removed, and rmdir below fails).
  for (bool removed = true; removed;) {
    removed = false;
    if (::lseek(fd, 0, SEEK_SET) != 0) break;
    for (ssize_t n; (n = ::getdents64(fd, buf, sizeof buf)) > 0;) {
      for (ssize_t at = 0; at < n;) {
        const auto* e = reinterpret_cast<const struct dirent64*>(buf + at);
        at += e->d_reclen;
        if (!IsDotOrDotDot(e->d_name) && RemoveAt(fd, e->d_name, depth - 1)) removed = true;
      }
    }
  }
  ::close(fd);
  return ::unlinkat(dirfd, name, AT_REMOVEDIR) == 0 || errno == ENOENT;
}

void OnSignal(int sig) {
  for (Slot& s : slots) {
    if (s.state.load(std::memory_order_acquire) == kReady) RemoveAt(AT_FDCWD, s.path, kMaxDepth);
  }
  // The default action, raised again: the process ends as the signal would have ended it (the signal is
  // blocked in its own handler, so it arrives when the handler returns).
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  ::raise(sig);
}

void Install() {
  if (installed.exchange(true)) return;
  struct sigaction act = {};
  act.sa_handler = OnSignal;
  sigemptyset(&act.sa_mask);
  for (int sig : kSignals) sigaddset(&act.sa_mask, sig);  // one handler at a time
  for (int sig : kSignals) {
    struct sigaction old = {};
    if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler == SIG_IGN) continue;  // e.g. SIGHUP under nohup
    ::sigaction(sig, &act, nullptr);
  }
}

}  // namespace

bool RemoveOnSignal(const std::string& path) {
  if (path.empty() || path.size() >= kMaxPath) return false;
  Install();
  for (Slot& s : slots) {
    int free = kFree;
    if (!s.state.compare_exchange_strong(free, kClaimed, std::memory_order_acquire)) continue;
    std::memcpy(s.path, path.c_str(), path.size() + 1);
    s.state.store(kReady, std::memory_order_release);
    return true;
  }
  return false;
}

void ForgetOnSignal(const std::string& path) {
  for (Slot& s : slots) {
    if (s.state.load(std::memory_order_acquire) == kReady && path == s.path) {
      s.state.store(kFree, std::memory_order_release);
      return;
    }
  }
}

}  // namespace gradtrace::pack
