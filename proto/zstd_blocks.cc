// ReadZstdBlocks (zstd_blocks.h).
#include "zstd_blocks.h"

#include <sys/uio.h>

#include <cstring>

#define ZSTD_STATIC_LINKING_ONLY  // the block-level API: ZSTD_decompressBlock, ZSTD_insertBlock
#include <zstd.h>

#include "crc32c.h"

namespace gradtrace {

namespace {

constexpr size_t kBlockHeader = 3;

// Reads len bytes at `at` into `dst`, then (when next != nullptr) the following kBlockHeader bytes into `next`:
// one system call.
bool ReadThen(int fd, uint64_t at, void* dst, size_t len, uint8_t* next) {
  iovec io[2] = {{dst, len}, {next, next != nullptr ? kBlockHeader : 0}};
  const size_t want = len + io[1].iov_len;
  return preadv(fd, io, 2, static_cast<off_t>(at)) == static_cast<ssize_t>(want);
}

}  // namespace

bool ReadZstdBlocks(int fd, uint64_t at, uint32_t stored_len, ZSTD_DCtx_s* ctx, char* out, uint32_t raw_len,
                    uint32_t* crc, std::string* piece, char* stored) {
  // What was read, at `from` of the frame, into the caller's copy of the stored bytes.
  auto copy = [stored](uint64_t from, const void* bytes, size_t len) {
    if (stored != nullptr) std::memcpy(stored + from, bytes, len);
  };
  // The frame header: its first bytes say how long it is; then the rest of it and the first block's header.
  uint8_t head[ZSTD_FRAMEHEADERSIZE_MAX + kBlockHeader];
  constexpr size_t kPrefix = ZSTD_FRAMEHEADERSIZE_PREFIX(ZSTD_f_zstd1);
  if (stored_len < kPrefix + kBlockHeader || pread(fd, head, kPrefix, static_cast<off_t>(at)) != kPrefix) return false;
  const size_t header_len = ZSTD_frameHeaderSize(head, kPrefix);
  if (ZSTD_isError(header_len) || header_len > ZSTD_FRAMEHEADERSIZE_MAX || header_len + kBlockHeader > stored_len ||
      pread(fd, head + kPrefix, header_len + kBlockHeader - kPrefix, static_cast<off_t>(at + kPrefix)) !=
          static_cast<ssize_t>(header_len + kBlockHeader - kPrefix)) {
    return false;
  }
  ZSTD_frameHeader zfh;
  if (ZSTD_getFrameHeader(&zfh, head, header_len) != 0 || zfh.frameType != ZSTD_frame || zfh.headerSize != header_len ||
      zfh.frameContentSize != raw_len || zfh.dictID != 0 || zfh.checksumFlag != 0) {
    return false;
  }
  const size_t block_max = zfh.blockSizeMax;  // min(window, 128 KiB): no block holds or makes more
  if (ZSTD_isError(ZSTD_decompressBegin(ctx))) return false;
  *crc = crc32c::Extend(*crc, head, header_len + kBlockHeader);
  copy(0, head, header_len + kBlockHeader);
  uint8_t bh[kBlockHeader];
  std::memcpy(bh, head + header_len, kBlockHeader);
  uint64_t in = header_len + kBlockHeader;  // stored bytes consumed
  uint64_t made = 0;                        // content bytes written
  for (;;) {
    const uint32_t word = uint32_t{bh[0]} | uint32_t{bh[1]} << 8 | uint32_t{bh[2]} << 16;
    const bool last = word & 1;
    const uint32_t type = (word >> 1) & 3, size = word >> 3;
    const uint64_t body = type == 1 ? 1 : size;  // an RLE block stores its one byte
    if (type == 3 || size > block_max || body > stored_len - in || (!last && stored_len - in - body < kBlockHeader) ||
        (last && stored_len - in - body != 0)) {
      return false;
    }
    uint8_t next[kBlockHeader];
    uint8_t* then = last ? nullptr : next;
    char* dst = out + made;
    const uint64_t room = raw_len - made;
    if (type == 0) {  // raw: straight into place
      if (size > room || !ReadThen(fd, at + in, dst, size, then)) return false;
      *crc = crc32c::Extend(*crc, dst, size);
      copy(in, dst, size);
      ZSTD_insertBlock(ctx, dst, size);
      made += size;
    } else if (type == 1) {  // RLE: one byte, repeated
      uint8_t byte = 0;
      if (size > room || !ReadThen(fd, at + in, &byte, 1, then)) return false;
      *crc = crc32c::Extend(*crc, &byte, 1);
      copy(in, &byte, 1);
      std::memset(dst, byte, size);
      ZSTD_insertBlock(ctx, dst, size);
      made += size;
    } else {  // compressed: through the piece buffer and zstd
      if (piece->size() < size) piece->resize(block_max);
      if (!ReadThen(fd, at + in, piece->data(), size, then)) return false;
      *crc = crc32c::Extend(*crc, piece->data(), size);
      copy(in, piece->data(), size);
      const size_t cap = static_cast<size_t>(room < block_max ? room : block_max);
      const size_t n = ZSTD_decompressBlock(ctx, dst, cap, piece->data(), size);
      if (ZSTD_isError(n)) return false;
      made += n;
    }
    in += body;
    if (last) return made == raw_len;
    *crc = crc32c::Extend(*crc, next, kBlockHeader);
    copy(in, next, kBlockHeader);
    std::memcpy(bh, next, kBlockHeader);
    in += kBlockHeader;
  }
}

}  // namespace gradtrace
