#include "file_pool.h"

#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "regular_file.h"

namespace gradtrace {
namespace {

struct Pool {
  std::mutex mu;
  std::list<PooledFile*> idle;  // open, unpinned, least recently used first
  size_t open = 0;
  size_t budget_override = 0;
};

Pool& ThePool() {
  static Pool* pool = new Pool();  // never destroyed: readers may outlive static destruction order
  return *pool;
}

size_t BudgetFromLimit() {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return 512;
  return std::clamp<size_t>(static_cast<size_t>(rl.rlim_cur) / 4, 16, 512);
}

}  // namespace

size_t FilePoolBudget() {
  Pool& p = ThePool();
  std::lock_guard<std::mutex> lock(p.mu);
  return p.budget_override > 0 ? p.budget_override : BudgetFromLimit();
}

size_t FilePoolOpenFiles() {
  Pool& p = ThePool();
  std::lock_guard<std::mutex> lock(p.mu);
  return p.open;
}

void SetFilePoolBudgetForTesting(size_t budget) {
  Pool& p = ThePool();
  std::lock_guard<std::mutex> lock(p.mu);
  p.budget_override = budget;
}

PooledFile::PooledFile(std::string path, std::string name)
    : path_(std::move(path)), name_(name.empty() ? path_ : std::move(name)) {}

PooledFile::~PooledFile() {
  Pool& p = ThePool();
  std::lock_guard<std::mutex> lock(p.mu);
  CloseLocked();
}

void PooledFile::CloseLocked() {
  Pool& p = ThePool();
  if (idle_) p.idle.erase(idle_at_);
  idle_ = false;
  if (file_ != nullptr) {
    std::fclose(file_);
    file_ = nullptr;
    --p.open;
  }
}

Expected<PooledFile::Lease> PooledFile::Acquire() {
  Pool& p = ThePool();
  std::lock_guard<std::mutex> lock(p.mu);
  if (file_ == nullptr) {
    const size_t budget = p.budget_override > 0 ? p.budget_override : BudgetFromLimit();
    // Pinned files are never closed: with more readers in use at once than the budget, it is exceeded.
    while (p.open >= budget && !p.idle.empty()) p.idle.front()->CloseLocked();
    auto opened = OpenRegularFile(path_, name_);
    if (!opened.ok()) return opened.status();
    struct stat st;
    if (fstat(fileno(*opened), &st) != 0) {
      const int err = errno;
      std::fclose(*opened);
      return Status::IoError(name_ + ": cannot stat: " + std::strerror(err));
    }
    const auto dev = static_cast<uint64_t>(st.st_dev), ino = static_cast<uint64_t>(st.st_ino);
    const auto size = static_cast<uint64_t>(st.st_size);
    if (seen_ && (dev != dev_ || ino != ino_ || size != size_)) {
      std::fclose(*opened);
      return Status::IoError(name_ + ": changed since it was first opened (now " + std::to_string(size) +
                             " bytes, was " + std::to_string(size_) + ", or another file at that path)");
    }
    seen_ = true;
    dev_ = dev, ino_ = ino, size_ = size;
    file_ = *opened;
    ++p.open;
  } else if (idle_) {
    p.idle.erase(idle_at_);
    idle_ = false;
  }
  ++pins_;
  return Lease(this);
}

void PooledFile::Release() {
  Pool& p = ThePool();
  std::lock_guard<std::mutex> lock(p.mu);
  if (--pins_ > 0 || file_ == nullptr) return;
  p.idle.push_back(this);
  idle_at_ = std::prev(p.idle.end());
  idle_ = true;
}

PooledFile::Lease::~Lease() {
  if (owner_ != nullptr) owner_->Release();
}

std::FILE* PooledFile::Lease::file() const { return owner_->file_; }

int PooledFile::Lease::fd() const { return fileno(owner_->file_); }

}  // namespace gradtrace
