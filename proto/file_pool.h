// Rank files opened on demand under one process-wide bound. A trace set of a
// cluster has thousands of rank files; a reader of each kept open hit the
// common limit of 1,024 open files at a few hundred ranks (issue 42). Each
// TraceReader holds a PooledFile instead of a FILE: it is open only while the
// pool's budget allows, closed least-recently-used first when another file
// needs the slot, and opened again by path on the next read, checked to be the
// same file (device, inode, size) as at the first open.
//
// Thread safety: the pool is shared; a Lease pins its file open for as long as
// it lives, so a read on one thread is never closed under it by an open on
// another. One PooledFile is used by one thread at a time (as its reader is).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <list>
#include <string>

#include "status.h"

namespace gradtrace {

class PooledFile {
 public:
  // `path` to open (a regular file, OpenRegularFile); errors name `name`.
  PooledFile(std::string path, std::string name);
  ~PooledFile();
  PooledFile(const PooledFile&) = delete;
  PooledFile& operator=(const PooledFile&) = delete;

  // The file held open while it lives; reads go through file() (or fd()).
  class Lease {
   public:
    Lease(Lease&& other) noexcept : owner_(other.owner_) { other.owner_ = nullptr; }
    Lease& operator=(Lease&&) = delete;
    Lease(const Lease&) = delete;
    ~Lease();
    std::FILE* file() const;
    int fd() const;

   private:
    friend class PooledFile;
    explicit Lease(PooledFile* owner) : owner_(owner) {}
    PooledFile* owner_;
  };

  // Opens the file when it is closed (closing the pool's least recently used idle file first when the budget
  // is spent) and pins it. IoError "<name>: cannot open: ..." or "<name>: changed since it was first opened
  // (...)" when the path now names another file.
  Expected<Lease> Acquire();

  // The size of the file at its first open (0 before one).
  uint64_t size() const { return size_; }

 private:
  void Release();
  void CloseLocked();

  std::string path_, name_;
  std::FILE* file_ = nullptr;
  int pins_ = 0;
  bool idle_ = false;
  std::list<PooledFile*>::iterator idle_at_;
  bool seen_ = false;  // opened once: the identity below is known
  uint64_t dev_ = 0, ino_ = 0, size_ = 0;
};

// How many files the pool keeps open at most: a quarter of RLIMIT_NOFILE's soft limit, between 16 and 512
// (the rest stays free for outputs, archives, threads and the libraries), or what the test set.
size_t FilePoolBudget();
// The files open in the pool now (for tests and benchmarks).
size_t FilePoolOpenFiles();
// Tests: replaces the budget (0 restores the RLIMIT_NOFILE rule).
void SetFilePoolBudgetForTesting(size_t budget);

}  // namespace gradtrace
