#include "launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

namespace gradtrace::capture {

namespace {

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

Status ParseIntEnv(const char* name, int* out) {
  const char* v = Env(name);
  if (!v) return Status::InvalidArgument(std::string("environment variable ") + name + " is not set");
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > (1 << 24)) {
    return Status::InvalidArgument(std::string("environment variable ") + name + "='" + v +
                                   "' is not a non-negative integer");
  }
  *out = static_cast<int>(x);
  return Status::Ok();
}

volatile sig_atomic_t g_stop_signal = 0;
void OnStopSignal(int sig) { g_stop_signal = sig; }

struct Child {
  pid_t pid = -1;
  int out_fd = -1, err_fd = -1;
  std::string out_buf, err_buf;
  bool exited = false;
  int status = 0;
};

// Writes every complete line in `buf` to `fd` with the prefix; keeps the rest.
void FlushLines(std::string& buf, const std::string& prefix, int fd, bool all) {
  size_t start = 0;
  for (;;) {
    size_t nl = buf.find('\n', start);
    if (nl == std::string::npos) break;
    std::string line = prefix + buf.substr(start, nl - start + 1);
    (void)!write(fd, line.data(), line.size());
    start = nl + 1;
  }
  buf.erase(0, start);
  if (all && !buf.empty()) {
    std::string line = prefix + buf + "\n";
    (void)!write(fd, line.data(), line.size());
    buf.clear();
  }
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + strsignal(WTERMSIG(status));
  return "stopped";
}

}  // namespace

std::string FirstSlurmHost(const std::string& nodelist) {
  std::string first;
  int depth = 0;
  for (char c : nodelist) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) break;
    first += c;
  }
  size_t lb = first.find('[');
  if (lb == std::string::npos) return first;
  std::string prefix = first.substr(0, lb);
  std::string range = first.substr(lb + 1);
  size_t stop = range.find_first_of("-,]");
  return prefix + range.substr(0, stop);
}

int FindFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 29500;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  int port = 29500;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

Expected<DistEnv> DistEnvFromEnvironment() {
  DistEnv e;
  if (Env("RANK") || Env("WORLD_SIZE")) {
    e.source = "torchrun";
    GT_RETURN_IF_ERROR(ParseIntEnv("RANK", &e.rank));
    GT_RETURN_IF_ERROR(ParseIntEnv("WORLD_SIZE", &e.world));
    if (Env("LOCAL_RANK")) GT_RETURN_IF_ERROR(ParseIntEnv("LOCAL_RANK", &e.local_rank));
    if (!Env("MASTER_ADDR")) return Status::InvalidArgument("environment variable MASTER_ADDR is not set");
    e.master_addr = Env("MASTER_ADDR");
    GT_RETURN_IF_ERROR(ParseIntEnv("MASTER_PORT", &e.master_port));
  } else if (Env("SLURM_PROCID")) {
    e.source = "slurm";
    GT_RETURN_IF_ERROR(ParseIntEnv("SLURM_PROCID", &e.rank));
    GT_RETURN_IF_ERROR(ParseIntEnv("SLURM_NTASKS", &e.world));
    if (Env("SLURM_LOCALID")) GT_RETURN_IF_ERROR(ParseIntEnv("SLURM_LOCALID", &e.local_rank));
    if (Env("MASTER_ADDR")) {
      e.master_addr = Env("MASTER_ADDR");
    } else if (Env("SLURM_JOB_NODELIST")) {
      e.master_addr = FirstSlurmHost(Env("SLURM_JOB_NODELIST"));
    } else {
      return Status::InvalidArgument("SLURM job without MASTER_ADDR or SLURM_JOB_NODELIST");
    }
    if (Env("MASTER_PORT")) {
      GT_RETURN_IF_ERROR(ParseIntEnv("MASTER_PORT", &e.master_port));
    } else {
      int job = 0;
      if (Env("SLURM_JOB_ID")) GT_RETURN_IF_ERROR(ParseIntEnv("SLURM_JOB_ID", &job));
      e.master_port = 29500 + job % 1000;
    }
  } else {
    e.source = "standalone";
    e.master_port = FindFreePort();
    return e;
  }
  if (e.world < 1 || e.rank >= e.world) {
    return Status::InvalidArgument("rank " + std::to_string(e.rank) + " is outside a world of " +
                                   std::to_string(e.world) + " (" + e.source + " environment)");
  }
  if (e.master_port <= 0 || e.master_port > 65535) {
    return Status::InvalidArgument("MASTER_PORT " + std::to_string(e.master_port) + " is not a TCP port");
  }
  return e;
}

namespace {

// Forks rank `r` with torchrun's variables, its stdout/stderr on pipes.
bool SpawnRank(int r, int nproc, int port, pid_t parent, const std::string& exe, const std::vector<std::string>& args,
               Child* child) {
  int out[2], err[2];
  if (pipe(out) != 0 || pipe(err) != 0) {
    std::cerr << "gradtrace-train: pipe: " << std::strerror(errno) << "\n";
    return false;
  }
  pid_t pid = fork();
  if (pid < 0) {
    std::cerr << "gradtrace-train: fork: " << std::strerror(errno) << "\n";
    return false;
  }
  if (pid == 0) {
    // A rank must not outlive its launcher.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    dup2(out[1], 1);
    dup2(err[1], 2);
    close(out[0]);
    close(out[1]);
    close(err[0]);
    close(err[1]);
    setenv("RANK", std::to_string(r).c_str(), 1);
    setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
    setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
    setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(exe.c_str()));
    for (size_t i = 1; i < args.size(); ++i) argv.push_back(const_cast<char*>(args[i].c_str()));
    argv.push_back(nullptr);
    execv(exe.c_str(), argv.data());
    std::fprintf(stderr, "gradtrace-train: exec %s: %s\n", exe.c_str(), std::strerror(errno));
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  child->pid = pid;
  child->out_fd = out[0];
  child->err_fd = err[0];
  return true;
}

// Waits up to 100 ms for output and forwards complete lines with a "[rank N] " prefix.
void PumpOutput(std::vector<Child>& children) {
  std::vector<pollfd> fds;
  std::vector<std::pair<int, bool>> owner;  // (rank, is_stderr)
  for (int r = 0; r < static_cast<int>(children.size()); ++r) {
    if (children[r].out_fd >= 0) {
      fds.push_back({children[r].out_fd, POLLIN, 0});
      owner.push_back({r, false});
    }
    if (children[r].err_fd >= 0) {
      fds.push_back({children[r].err_fd, POLLIN, 0});
      owner.push_back({r, true});
    }
  }
  if (!fds.empty()) poll(fds.data(), fds.size(), 100);
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    auto [r, is_err] = owner[i];
    Child& c = children[r];
    char buf[65536];
    ssize_t n = read(fds[i].fd, buf, sizeof(buf));
    std::string& acc = is_err ? c.err_buf : c.out_buf;
    const std::string prefix = "[rank " + std::to_string(r) + "] ";
    if (n > 0) {
      acc.append(buf, n);
      FlushLines(acc, prefix, is_err ? 2 : 1, false);
    } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
      FlushLines(acc, prefix, is_err ? 2 : 1, true);
      close(fds[i].fd);
      (is_err ? c.err_fd : c.out_fd) = -1;
    }
  }
}

// Stopping every rank once one fails or a signal arrives: SIGTERM, then
// SIGKILL after 5 s.
struct Stopper {
  bool stopping = false;
  int result = 0;
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();

  void Begin(std::vector<Child>& children, int exit_code) {
    stopping = true;
    result = exit_code;
    Signal(children, SIGTERM);
    deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  }
  void KillIfLate(std::vector<Child>& children) {
    if (!stopping || std::chrono::steady_clock::now() <= deadline) return;
    Signal(children, SIGKILL);
    deadline = std::chrono::steady_clock::time_point::max();
  }
  static void Signal(std::vector<Child>& children, int sig) {
    for (auto& c : children) {
      if (!c.exited) kill(c.pid, sig);
    }
  }
};

// Reaps exited ranks; the first failure stops the others. Returns whether all have exited.
bool ReapRanks(std::vector<Child>& children, Stopper* stop) {
  bool all_exited = true;
  for (int r = 0; r < static_cast<int>(children.size()); ++r) {
    Child& c = children[r];
    if (c.exited) continue;
    int status = 0;
    if (waitpid(c.pid, &status, WNOHANG) != c.pid) {
      all_exited = false;
      continue;
    }
    c.exited = true;
    c.status = status;
    const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (failed && !stop->stopping) {
      std::cerr << "gradtrace-train: rank " << r << " " << DescribeExit(status) << "; stopping the other ranks\n";
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      stop->Begin(children, code == 0 ? 1 : code);
    }
  }
  return all_exited;
}

}  // namespace

int LaunchLocal(int nproc, const std::string& exe, const std::vector<std::string>& args) {
  const int port = FindFreePort();
  std::vector<Child> children(nproc);
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  const pid_t parent = getpid();
  for (int r = 0; r < nproc; ++r) {
    if (!SpawnRank(r, nproc, port, parent, exe, args, &children[r])) return 1;
  }

  Stopper stop;
  for (;;) {
    PumpOutput(children);
    const bool all_exited = ReapRanks(children, &stop);
    if (g_stop_signal && !stop.stopping) {
      std::cerr << "gradtrace-train: received signal " << g_stop_signal << "; stopping all ranks\n";
      stop.Begin(children, 128 + g_stop_signal);
    }
    stop.KillIfLate(children);
    bool pipes_open = false;
    for (auto& c : children) pipes_open |= (c.out_fd >= 0 || c.err_fd >= 0);
    if (all_exited && !pipes_open) break;
    if (all_exited && pipes_open) {
      // Grandchildren may hold the pipes; do not wait for them.
      bool any = false;
      for (auto& c : children) any |= !c.out_buf.empty() || !c.err_buf.empty();
      if (!any && stop.stopping) break;
    }
  }
  return stop.result;
}

}  // namespace gradtrace::capture
