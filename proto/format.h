// The gradtrace file layout. The prose spec is proto/FORMAT.md; this header is
// its executable summary and the only place these numbers live.
//
// File   := FileHeader Frame* [IndexFrame Footer]
// FileHeader (16 bytes):
//   magic "GRDTRACE" (8) | major u16 | minor u16 | flags u32 (bit 0: kFlagIndexed)
// Frame header (16 bytes, little-endian), then `stored_len` payload bytes:
//   stored_len u32 | raw_len u32 | crc32c u32 | type u8 | codec u8 | reserved u16
//   crc32c is the masked CRC32C of header bytes [12,16) followed by the payload.
//   raw_len is the payload's size after decompression (== stored_len for codec 0).
// IndexFrame := one or more frames of type kIndex, back to back.
// Footer (16 bytes): index_frame_offset u64 (the first index frame) | magic "GTINDEX\0" (8)
#pragma once

#include <cstddef>
#include <cstdint>

namespace gradtrace::format {

inline constexpr char kFileMagic[8] = {'G', 'R', 'D', 'T', 'R', 'A', 'C', 'E'};
inline constexpr char kFooterMagic[8] = {'G', 'T', 'I', 'N', 'D', 'E', 'X', '\0'};
// Minor version when adding fields or frame types; major when changing existing ones.
inline constexpr uint16_t kMajorVersion = 1;
inline constexpr uint16_t kMinorVersion = 6;
// Minor versions: 1.0 the first; 1.1 index entries catalogue each BucketRecord
// (param ids, group, raw_len, partition, divisor) so readers need not decompress
// data frames to know what they hold.
inline constexpr uint16_t kMinorCataloguedIndex = 1;
// 1.2 adds the parallel layout (Config tp/pp/cp/edp, ParamInfo grad_group/kind/
// partition_dim, RunInfo framework/versions/coordinates) and StepInfo's reported
// grad norm: fields only, so no reader branches on it. 1.3 adds Config.replicate
// (HSDP), a field too. 1.4 adds the precision chain, the initial-weight sketch
// and the input moments (FORMAT.md 4.1): fields again. 1.5 adds pipeline
// parallelism (Config.pp_stages/pp_microbatches/pp_schedule/pp_scale_grads,
// ParamInfo.stages): fields. 1.6 adds BucketRecord.values_from, a record
// taking its values from an earlier frame: readers resolve it (FORMAT.md 4.3).
inline constexpr uint16_t kMinorValuesFrom = 6;
// What resolving references may decode over a reader's life: a reference
// frame is tens of bytes and its target up to 64 MiB, so without a bound a
// small hostile file could keep a reader decoding for hours. A pass over a
// writer's file decodes at most 32 times its size for references (two per
// target, each compressing less than 16 to 1), about 3 times for gradients:
// 256 leaves room for readers that read frames more than once, and is far
// less than what zstd itself lets a hostile frame cost (FORMAT.md 4.3).
inline constexpr uint64_t kReferenceDecodeFactor = 256;
inline constexpr uint64_t kReferenceDecodeSlack = uint64_t{256} << 20;

// 1.4: ParamInfo.init_sketch holds at most this many values (FORMAT.md 4.1).
inline constexpr int kInitSketchSize = 16;

inline constexpr size_t kFileHeaderSize = 16;
inline constexpr size_t kFrameHeaderSize = 16;
inline constexpr size_t kFooterSize = 16;

// FileHeader flags. kFlagIndexed: the writer meant to finish the file with
// index frames and a footer, so a file without them was cut short (a crash or
// a truncation) and readers report it as Truncated. Bits not defined by the
// file's minor version must be zero; a reader refuses them unless the file's
// minor version is newer than its own.
inline constexpr uint32_t kFlagIndexed = 1u << 0;
inline constexpr uint32_t kKnownFlags = kFlagIndexed;

// No frame payload, stored or decompressed, may exceed this: a reader refuses
// larger declared sizes before allocating anything.
inline constexpr uint32_t kMaxFramePayload = 64u << 20;  // 64 MiB
// Writers split records so one frame's raw payload stays below this. Small
// frames keep a reader's buffers in cache and let the diff decode each frame
// once (docs/dev/performance.md: 4 MiB halved the diff's CPU time against 48 MiB
// at the same compressed size).
inline constexpr uint32_t kChunkTarget = 4u << 20;
// Bounds on counts read from a file (checked before use).
inline constexpr int64_t kMaxParams = 1 << 20;
inline constexpr int64_t kMaxIndexEntries = 1 << 26;
// Writers put at most this many entries in one index frame, and fewer when
// their serialized size would pass kChunkTarget (entries carry param ids).
inline constexpr int64_t kIndexEntriesPerFrame = 1 << 19;

// Bounds on what parsing one frame payload may allocate, enforced by a
// pre-pass over the wire bytes before ParseFromString (parse_limits.h).
// Without them 64 MiB of 2-byte empty sub-messages become 32 million objects
// (~3 GB). "Objects" are sub-messages (map entries included), repeated
// string elements and unknown fields; parsed, each costs at most ~160 bytes
// (a ParamInfo with its name and shape). Measured at these limits, a parse
// peaks at 177 MB (RunInfo), 157 MB (BucketRecord), 77 MB (Index): under
// three frame buffers (FORMAT.md 3.4). Each limit is what the largest
// legitimate frame needs plus kParseObjectSlack (config, groups, map entries,
// fields of newer minor versions):
//   RunInfo: one ParamInfo per parameter (kMaxParams);
//   StepInfo: no sub-messages;
//   BucketRecord: a slice and its payload per parameter of the bucket;
//   Index frame: an entry, and room for one sub-message each, per entry.
inline constexpr int64_t kParseObjectSlack = 1 << 16;
inline constexpr int64_t kMaxRunInfoObjects = kMaxParams + kParseObjectSlack;
inline constexpr int64_t kMaxStepInfoObjects = kParseObjectSlack;
inline constexpr int64_t kMaxBucketRecordObjects = 2 * kMaxParams + kParseObjectSlack;
inline constexpr int64_t kMaxIndexFrameObjects = 2 * kIndexEntriesPerFrame + kParseObjectSlack;
// Repeated numbers (packed or not) decode from as little as 1 wire byte to 8
// bytes; a legitimate sketch (a position and a double, >= 9 wire bytes per
// pair, 16 in memory) needs under 2 bytes per payload byte, so two frame
// buffers.
inline constexpr int64_t kMaxRepeatedScalarBytes = 2 * int64_t{kMaxFramePayload};

enum class FrameType : uint8_t {
  kRunInfo = 1,
  kStepInfo = 2,
  kBucketRecord = 3,
  kIndex = 4,
};

enum class Codec : uint8_t {
  kNone = 0,
  kZstd = 1,
};

}  // namespace gradtrace::format
