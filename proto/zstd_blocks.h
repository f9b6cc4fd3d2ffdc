// One zstd frame read from a file block by block (RFC 8878 section 3.1.1.2),
// so that the bytes of its raw blocks go from the file straight to where they
// belong. Gradients' low mantissa bytes do not compress: zstd stores them as
// raw blocks, and its decoder copies each out of the input buffer (a tenth of a
// streamed diff's CPU, the largest part of libzstd's). Here they are read into
// the output, compressed blocks go through ZSTD_decompressBlock, RLE blocks
// are filled, and zstd is told of the blocks it did not decode
// (ZSTD_insertBlock) so that later blocks find their history.
#pragma once

#include <cstdint>
#include <string>

struct ZSTD_DCtx_s;

namespace gradtrace {

// The zstd frame of `stored_len` bytes at file offset `at` of `fd`, whose
// content is `raw_len` bytes, decoded into out[0, raw_len); *crc extended (as
// crc32c::Extend) over every stored byte in order. `piece` is a buffer of the
// caller's (a compressed block at most: 128 KiB). `stored`, when not null,
// gets the stored_len bytes as they are in the file. False where the frame is not
// the plain shape the trace writer makes (one frame, its content size
// declared, no dictionary, no checksum, every block within its limits) or a
// read is short or zstd refuses a block: the caller then decodes the frame its
// usual way, which judges it; out and *crc are then unusable.
bool ReadZstdBlocks(int fd, uint64_t at, uint32_t stored_len, ZSTD_DCtx_s* ctx, char* out, uint32_t raw_len,
                    uint32_t* crc, std::string* piece, char* stored = nullptr);

}  // namespace gradtrace
