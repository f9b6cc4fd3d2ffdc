// ReadZstdBlocks against zstd's own decoder: frames of raw, RLE and compressed
// blocks (and small windows) decode to zstd's bytes, with the CRC32C and the
// copy of the stored bytes the streaming read gives; frames of another shape
// are declined; and of thousands of damaged frames it accepts none that zstd
// refuses, and gives zstd's bytes for every one it takes.
#include "zstd_blocks.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <random>
#include <string>

#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>

#include "crc32c.h"
#include "test_util.h"

namespace gradtrace {
namespace {

constexpr size_t kJunk = 13;  // the frame sits at an odd file offset

std::string Compress(const std::string& content, int window_log = 0, bool checksum = false, bool size = true) {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 3);
  if (window_log > 0) ZSTD_CCtx_setParameter(c, ZSTD_c_windowLog, window_log);
  ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, checksum ? 1 : 0);
  ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, size ? 1 : 0);
  std::string out(ZSTD_compressBound(content.size()), '\0');
  const size_t n = ZSTD_compress2(c, out.data(), out.size(), content.data(), content.size());
  ZSTD_freeCCtx(c);
  EXPECT_FALSE(ZSTD_isError(n));
  out.resize(n);
  return out;
}

// Gradient-like content: block-long runs (128 KiB) of random bytes (raw blocks), of one byte (RLE), of text.
std::string Mixed(size_t runs, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s;
  for (size_t r = 0; r < runs; ++r) {
    std::string run(128 << 10, '\0');
    switch (r % 3) {
      case 0:
        for (char& ch : run) ch = static_cast<char>(rng());
        break;
      case 1:
        std::fill(run.begin(), run.end(), static_cast<char>(r));
        break;
      default:
        for (size_t i = 0; i < run.size(); ++i) run[i] = "gradient scale factor "[(i + r) % 22];
    }
    s += run;
  }
  return s;
}

// How many blocks of each type (raw, RLE, compressed) a well-formed frame holds.
std::array<int, 3> BlockTypes(const std::string& frame) {
  std::array<int, 3> n{};
  size_t at = ZSTD_frameHeaderSize(frame.data(), frame.size());
  for (;;) {
    const auto byte = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(frame[at + i])); };
    const uint32_t word = byte(0) | byte(1) << 8 | byte(2) << 16;
    const uint32_t type = (word >> 1) & 3;
    if (type < 3) ++n[type];
    at += 3 + (type == 1 ? 1 : word >> 3);
    if (word & 1) return n;
  }
}

struct Result {
  bool taken = false;
  std::string out, stored;
  uint32_t crc = 0;
};

Result Read(const std::string& frame, uint32_t raw_len, uint64_t stored_len) {
  testing::TempDir dir;
  const std::string path = dir.File("frame");
  testing::WriteBytes(path, std::string(kJunk, 'j') + frame + "tail");
  const int fd = open(path.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0);
  ZSTD_DCtx* ctx = ZSTD_createDCtx();
  Result r;
  r.out.assign(raw_len, '\0');
  r.stored.assign(stored_len, '\0');
  std::string piece;
  r.taken = ReadZstdBlocks(fd, kJunk, static_cast<uint32_t>(stored_len), ctx, r.out.data(), raw_len, &r.crc, &piece,
                           r.stored.data());
  ZSTD_freeDCtx(ctx);
  close(fd);
  return r;
}

void ExpectTaken(const std::string& content, const std::string& frame) {
  const Result r = Read(frame, static_cast<uint32_t>(content.size()), frame.size());
  ASSERT_TRUE(r.taken);
  EXPECT_TRUE(r.out == content);
  EXPECT_TRUE(r.stored == frame);
  EXPECT_EQ(r.crc, crc32c::Extend(0, frame.data(), frame.size()));
}

TEST(ZstdBlocks, RawRleAndCompressedBlocksDecodeToZstdsBytes) {
  const std::string content = Mixed(12, 1);
  const std::string frame = Compress(content);
  const std::array<int, 3> types = BlockTypes(frame);
  EXPECT_GT(types[0], 0);
  EXPECT_GT(types[1], 0);
  EXPECT_GT(types[2], 0);
  ExpectTaken(content, frame);
  ExpectTaken(content, Compress(content, 10));  // a 1 KiB window: blocks of at most 1 KiB
  ExpectTaken("", Compress(""));
  ExpectTaken("x", Compress("x"));
  std::string random(300 << 10, '\0');
  std::mt19937 rng(2);
  for (char& ch : random) ch = static_cast<char>(rng());
  ExpectTaken(random, Compress(random));  // raw blocks only
  // Random bytes twice: the second copy's blocks are matches into the first's raw blocks (zstd must be told of them).
  const std::string twice = random + random;
  const std::string twice_frame = Compress(twice);
  ASSERT_LT(twice_frame.size(), twice.size() * 2 / 3);
  ExpectTaken(twice, twice_frame);
}

TEST(ZstdBlocks, FramesOfAnotherShapeAreDeclined) {
  const std::string content = Mixed(6, 3);
  const std::string frame = Compress(content);
  const auto n = static_cast<uint32_t>(content.size());
  EXPECT_FALSE(Read(Compress(content, 0, /*checksum=*/true), n, Compress(content, 0, true).size()).taken);
  EXPECT_FALSE(Read(Compress(content, 0, false, /*size=*/false), n, Compress(content, 0, false, false).size()).taken);
  EXPECT_FALSE(Read(frame, n - 1, frame.size()).taken);          // content size other than raw_len
  EXPECT_FALSE(Read(frame, n, frame.size() - 1).taken);          // cut short
  EXPECT_FALSE(Read(frame, n, frame.size() + 4).taken);          // bytes after the frame
  EXPECT_FALSE(Read(frame + frame, n, frame.size() * 2).taken);  // two frames
  std::string skippable(8, '\0');
  const uint32_t magic = ZSTD_MAGIC_SKIPPABLE_START, zero = 0;
  std::memcpy(skippable.data(), &magic, 4);
  std::memcpy(skippable.data() + 4, &zero, 4);
  EXPECT_FALSE(Read(skippable + frame, n, skippable.size() + frame.size()).taken);
  // The first block's header (after a frame header of 6 bytes here) set to the reserved type, then too large.
  const size_t header = ZSTD_frameHeaderSize(frame.data(), frame.size());
  ASSERT_FALSE(ZSTD_isError(header));
  std::string reserved = frame;
  reserved[header] = static_cast<char>(reserved[header] | 0x06);
  EXPECT_FALSE(Read(reserved, n, reserved.size()).taken);
  std::string big = frame;
  big[header + 2] = static_cast<char>(0xff);
  EXPECT_FALSE(Read(big, n, big.size()).taken);
}

// Damaged frames: whatever it takes, zstd takes too, and the bytes are zstd's.
TEST(ZstdBlocks, TakesNothingZstdRefusesAndGivesZstdsBytes) {
  const std::string content = Mixed(4, 5);
  const std::string frame = Compress(content, 12);
  std::mt19937 rng(7);
  ZSTD_DCtx* ctx = ZSTD_createDCtx();
  int taken = 0;
  for (int trial = 0; trial < 1500; ++trial) {
    std::string bad = frame;
    const int flips = 1 + trial % 4;
    for (int k = 0; k < flips; ++k) bad[rng() % bad.size()] ^= static_cast<char>(1 + rng() % 255);
    const Result r = Read(bad, static_cast<uint32_t>(content.size()), bad.size());
    if (!r.taken) continue;
    ++taken;
    std::string want(content.size(), '\0');
    const size_t n = ZSTD_decompressDCtx(ctx, want.data(), want.size(), bad.data(), bad.size());
    ASSERT_FALSE(ZSTD_isError(n)) << "trial " << trial << ": taken, zstd says " << ZSTD_getErrorName(n);
    ASSERT_EQ(n, content.size()) << "trial " << trial;
    ASSERT_TRUE(r.out == want) << "trial " << trial;
  }
  ZSTD_freeDCtx(ctx);
  EXPECT_GT(taken, 0);  // damaged raw bytes are still a frame: some are taken
}

}  // namespace
}  // namespace gradtrace
