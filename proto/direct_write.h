// The middle of a large frame written past the page cache (O_DIRECT), the rest
// of the file as before (issue 24, capture full). On the machines we measure,
// writing through the page cache costs what the guest's free memory makes it:
// 480 MB took 0.09 to 2.75 s of system time in runs a minute apart, against
// 0.03-0.04 s with O_DIRECT (docs/dev/performance.md); the capture's writer spent
// more time in write() than in zstd.
//
// Only whole 4 KiB blocks inside one frame go direct: a block holding a frame
// boundary (and every small frame) is written through stdio as before, so no
// block is ever written both ways and no page-cache page and direct write
// overlap. A frame's bytes are all written when WriteFrame returns, as before:
// a crash still leaves a file whose complete frames read back.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gradtrace {

class DirectWrites {
 public:
  static constexpr uint64_t kBlock = 4096;         // offset, length and memory alignment
  static constexpr uint64_t kMinimum = 256 << 10;  // smaller middles go through stdio

  DirectWrites() = default;
  DirectWrites(const DirectWrites&) = delete;
  DirectWrites& operator=(const DirectWrites&) = delete;
  ~DirectWrites();

  // Opens the regular file `fd` refers to again with O_DIRECT (through
  // /proc/self/fd). Where that fails (not a regular file, a filesystem without
  // O_DIRECT, no /proc) it stays disabled and every frame goes through stdio.
  void Open(int fd);
  bool enabled() const { return fd_ >= 0; }
  void Disable();

  // A buffer of `n` bytes for the bytes that go to file offset `at` on: its
  // byte i is block-aligned in memory wherever at + i is in the file. Valid
  // until the next call; null when disabled or out of memory.
  char* Place(uint64_t at, size_t n);
  // The block-aligned middle [lo, hi) of the bytes placed at `at`: lo is `at`
  // rounded up to a block, hi the end rounded down; lo == hi when there is no
  // middle worth writing direct (under kMinimum).
  struct Middle {
    uint64_t lo = 0, hi = 0;
  };
  static Middle MiddleOf(uint64_t at, size_t n);
  // Writes the placed bytes of file offsets [lo, hi) (a Middle) with O_DIRECT.
  // 0 on success, else errno; EINVAL means the device wants another alignment
  // (the caller disables and writes them through stdio).
  int Write(Middle m);

 private:
  int fd_ = -1;
  char* buffer_ = nullptr;  // kBlock-aligned
  size_t capacity_ = 0;
  uint64_t placed_at_ = 0;  // file offset of Place's result
  char* placed_ = nullptr;
};

}  // namespace gradtrace
