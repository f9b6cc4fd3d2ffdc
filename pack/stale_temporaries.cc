#include "stale_temporaries.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string_view>

namespace fs = std::filesystem;

namespace gradtrace::pack {
namespace {

// The process id at the end of `name` after `prefix` ("OUT.tmp."), or -1 when it is not all digits.
long PidAfter(std::string_view name, std::string_view prefix) {
  if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) return -1;
  const std::string_view digits = name.substr(prefix.size());
  if (digits.size() > 9) return -1;  // above any pid_max (4,194,304)
  long pid = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return -1;
    pid = pid * 10 + (c - '0');
  }
  return pid;
}

bool Gone(long pid) { return pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH; }

}  // namespace

std::vector<std::string> RemoveStaleTemporaries(const std::string& out) {
  std::vector<std::string> removed;
  const fs::path target(out);
  const std::string base = target.filename().string();
  if (base.empty()) return removed;
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(base + ".", 0) != 0) continue;
    for (const char* kind : kTemporaryKinds) {
      const long pid = PidAfter(name, base + "." + kind + ".");
      if (pid < 0 || pid == static_cast<long>(::getpid()) || !Gone(pid)) continue;
      std::error_code rm;
      if (fs::remove_all(e.path(), rm) != static_cast<std::uintmax_t>(-1) && !rm) removed.push_back(e.path().string());
      break;
    }
  }
  return removed;
}

}  // namespace gradtrace::pack
