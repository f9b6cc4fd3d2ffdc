// Encoding of the fixed-size parts of a file (header, frame header, footer),
// shared by the writer and the reader so the layout is written down once.
#pragma once

#include <cstdint>
#include <cstring>

#include "format.h"

namespace gradtrace::frame_io {

inline void PutU16(uint8_t* p, uint16_t v) {
  p[0] = v & 0xff;
  p[1] = v >> 8;
}
inline void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = (v >> (8 * i)) & 0xff;
}
inline void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = (v >> (8 * i)) & 0xff;
}
inline uint16_t GetU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
inline uint32_t GetU32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}
inline uint64_t GetU64(const uint8_t* p) { return GetU32(p) | static_cast<uint64_t>(GetU32(p + 4)) << 32; }

struct FrameHeader {
  uint32_t stored_len = 0;
  uint32_t raw_len = 0;
  uint32_t masked_crc = 0;
  uint8_t type = 0;
  uint8_t codec = 0;
  uint16_t reserved = 0;

  void Encode(uint8_t out[format::kFrameHeaderSize]) const {
    PutU32(out, stored_len);
    PutU32(out + 4, raw_len);
    PutU32(out + 8, masked_crc);
    out[12] = type;
    out[13] = codec;
    PutU16(out + 14, reserved);
  }
  static FrameHeader Decode(const uint8_t in[format::kFrameHeaderSize]) {
    return {GetU32(in), GetU32(in + 4), GetU32(in + 8), in[12], in[13], GetU16(in + 14)};
  }
};

// Offset of the bytes the CRC covers before the payload: type, codec, reserved.
inline constexpr size_t kCrcCoveredHeaderOffset = 12;

}  // namespace gradtrace::frame_io
