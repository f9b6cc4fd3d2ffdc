// Reads a trace file without trusting it. Order of checks for every frame:
//  1. declared sizes against the limits (before any allocation);
//  2. against the bytes left (truncation);
//  3. the CRC;
//  4. type, reserved bits, codec;
//  5. for zstd: not a skippable frame, content size == raw_len, exactly one
//     frame, then the decompressed size;
//  6. the protobuf: a pre-pass over the wire bytes counts the objects the
//     parse would create and refuses more than the frame type's limit
//     (parse_limits.h), so memory stays bounded while parsing, not after;
//     then the parse itself;
//  7. the record's contents (validate.h).
// ReadView reads a bucket record in one pass (CRC and decompression as the
// pieces arrive) and accepts only a frame that passes every check; anything
// else it hands to the two-step read, so errors come in the order above.
#include "trace_reader.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

// ZSTD_d_stableOutBuffer (ReadView) is in zstd's experimental section, stable since 1.4.4.
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "crc32c.h"
#include "format.h"
#include "frame_io.h"
#include "index_entry.h"
#include "parse_limits.h"
#include "regular_file.h"
#include "validate.h"
#include "values_from.h"
#include "zstd_blocks.h"

namespace gradtrace {
namespace {

// One zstd context per thread, shared by the thread's readers: a context per reader (about 95 KB each, with a
// reader held per rank and thread) took 1.9 GB at 10,000 ranks (issue 42). Every use decodes its frame to the
// end before it returns (and ReadView resets what it set), so readers on one thread never interleave in it.
// Null when zstd cannot allocate one; the callers say so.
ZSTD_DCtx* ThreadDctx() {
  struct Holder {
    ZSTD_DCtx* ctx = ZSTD_createDCtx();
    ~Holder() { ZSTD_freeDCtx(ctx); }
  };
  thread_local Holder holder;
  return holder.ctx;
}

constexpr uint8_t kRunInfo = static_cast<uint8_t>(format::FrameType::kRunInfo);
constexpr uint8_t kStepInfo = static_cast<uint8_t>(format::FrameType::kStepInfo);
constexpr uint8_t kBucketRecord = static_cast<uint8_t>(format::FrameType::kBucketRecord);
constexpr uint8_t kIndex = static_cast<uint8_t>(format::FrameType::kIndex);

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// Reads exactly n bytes at `offset`; the caller has checked they exist.
bool ReadExact(std::FILE* f, uint64_t offset, void* out, size_t n) {
  if (fseeko(f, static_cast<off_t>(offset), SEEK_SET) != 0) return false;
  return std::fread(out, 1, n, f) == n;
}

// `s` (Corruption or LimitExceeded, no location) prefixed with "<path>: offset <N>: ".
Status At(const std::string& where, const Status& s) {
  return s.code() == Status::Code::kLimitExceeded ? Status::LimitExceeded(where + s.message())
                                                  : Status::Corruption(where + s.message());
}

// A zstd skippable frame decodes to nothing: it must not pass as an empty payload.
bool IsSkippableZstdFrame(const std::string& stored) {
  return stored.size() >= 4 && (frame_io::GetU32(reinterpret_cast<const uint8_t*>(stored.data())) &
                                ZSTD_MAGIC_SKIPPABLE_MASK) == ZSTD_MAGIC_SKIPPABLE_START;
}

// Declared sizes against the limits, before anything is allocated for them.
Status CheckDeclaredSizes(const frame_io::FrameHeader& h) {
  if (h.stored_len > format::kMaxFramePayload) {
    return Status::LimitExceeded("declared stored_len " + std::to_string(h.stored_len) + " exceeds the limit of " +
                                 std::to_string(format::kMaxFramePayload));
  }
  if (h.raw_len > format::kMaxFramePayload) {
    return Status::LimitExceeded("declared raw_len " + std::to_string(h.raw_len) + " exceeds the limit of " +
                                 std::to_string(format::kMaxFramePayload));
  }
  return Status::Ok();
}

// The CRC over header and payload, then type and reserved bits (which a newer minor version may use).
Status CheckFrame(const uint8_t* hb, const frame_io::FrameHeader& h, const std::string& stored, bool newer_minor) {
  uint32_t crc = crc32c::Value(hb + frame_io::kCrcCoveredHeaderOffset,
                               format::kFrameHeaderSize - frame_io::kCrcCoveredHeaderOffset);
  crc = crc32c::Extend(crc, stored.data(), stored.size());
  if (crc32c::Mask(crc) != h.masked_crc) {
    return Status::Corruption("checksum mismatch (stored " + Hex(h.masked_crc) + ", computed " +
                              Hex(crc32c::Mask(crc)) + ")");
  }
  if (h.type == 0 || (h.type > kIndex && !newer_minor)) {
    return Status::Corruption("unknown frame type " + std::to_string(h.type));
  }
  if (h.reserved != 0 && !newer_minor) {
    return Status::Corruption("reserved frame header bits set (" + std::to_string(h.reserved) + ")");
  }
  return Status::Ok();
}

// Sizes a reused frame buffer to n bytes. Growing, it is allocated afresh at n rounded up to 256 KiB, not at
// twice its old capacity as std::string grows: frames of one writer differ by a few bytes, and doubling made
// every reused buffer twice a frame (page faults on memory never used). A fresh buffer's pages are mapped by one
// madvise(MADV_POPULATE_WRITE) (Linux 5.14) rather than a fault per 4 KiB page: on the 2-core VM a page touched
// first costs ~0.55 ms per MiB by faults and ~0.35 populated (docs/dev/performance.md), and a 1-rank diff's frame
// buffers are ~40 MiB. Where the kernel refuses, the pages fault in as before.
void SizeBuffer(std::string* buffer, size_t n) {
  if (n > buffer->capacity()) {
    constexpr size_t kGrain = size_t{1} << 18;
    std::string fresh;
    // Large buffers in whole grains (fewer regrowths); small frames exactly: a kept 5 KB frame reserving a
    // grain each was a mapping of its own, 10,000 of them per reader cache at 10,000 ranks (issue 42).
    fresh.reserve(n < kGrain ? n : (n + kGrain - 1) / kGrain * kGrain);
#ifdef MADV_POPULATE_WRITE
    static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const auto at = reinterpret_cast<uintptr_t>(fresh.data());
    const uintptr_t begin = (at + page - 1) / page * page, end = (at + fresh.capacity()) / page * page;
    if (n >= kGrain && end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE);
#endif
    buffer->swap(fresh);
  }
  buffer->resize(n);
}

// Decompresses a zstd payload into *payload. The zstd frame's own content
// size must agree with raw_len, so the output buffer (raw_len <=
// kMaxFramePayload) is the only allocation and decompression cannot write
// past it.
Status DecompressZstd(const std::string& stored, uint32_t raw_len, ZSTD_DCtx* ctx, std::string* payload) {
  if (IsSkippableZstdFrame(stored)) return Status::Corruption("payload is a zstd skippable frame, not data");
  const unsigned long long content = ZSTD_getFrameContentSize(stored.data(), stored.size());
  if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN || content != raw_len) {
    return Status::Corruption("zstd frame content size does not match raw_len " + std::to_string(raw_len));
  }
  if (ZSTD_findFrameCompressedSize(stored.data(), stored.size()) != stored.size()) {
    return Status::Corruption("payload is not exactly one zstd frame");
  }
  SizeBuffer(payload, raw_len);
  const size_t n = ZSTD_decompressDCtx(ctx, payload->data(), payload->size(), stored.data(), stored.size());
  if (ZSTD_isError(n)) return Status::Corruption(std::string("zstd: ") + ZSTD_getErrorName(n));
  if (n != raw_len) {
    return Status::Corruption("decompressed " + std::to_string(n) + " bytes, raw_len says " + std::to_string(raw_len));
  }
  return Status::Ok();
}

// The payload by the frame's codec; an uncompressed one is taken from `stored` (swapped, not copied).
Status DecodePayload(const frame_io::FrameHeader& h, std::string& stored, ZSTD_DCtx* ctx, std::string* payload) {
  switch (static_cast<format::Codec>(h.codec)) {
    case format::Codec::kNone:
      if (h.raw_len != h.stored_len) {
        return Status::Corruption("raw_len " + std::to_string(h.raw_len) + " != stored_len " +
                                  std::to_string(h.stored_len) + " for an uncompressed frame");
      }
      payload->swap(stored);
      return Status::Ok();
    case format::Codec::kZstd:
      if (ctx == nullptr) return Status::IoError("cannot create a zstd context");
      return DecompressZstd(stored, h.raw_len, ctx, payload);
    default:
      return Status::Corruption("unknown codec " + std::to_string(h.codec));
  }
}

}  // namespace

TraceReader::~TraceReader() = default;

Status TraceReader::ReadBytesAt(uint64_t offset, void* out, size_t n, const std::string& where) {
  auto lease = file_->Acquire();
  if (!lease.ok()) return lease.status();
  if (!ReadExact(lease->file(), base_ + offset, out, n)) {
    return Status::IoError(where + "read failed: " + std::strerror(errno));
  }
  return Status::Ok();
}

std::string TraceReader::Where(uint64_t offset) const { return path_ + ": offset " + std::to_string(offset) + ": "; }

Expected<std::unique_ptr<TraceReader>> TraceReader::Open(const std::string& path, const ReadOptions& options) {
  return Open(TraceSource::File(path), options);
}

Expected<std::unique_ptr<TraceReader>> TraceReader::Open(const TraceSource& source, const ReadOptions& options) {
  static std::atomic<uint64_t> opened{0};
  std::unique_ptr<TraceReader> r(new TraceReader());
  r->serial_ = ++opened;
  r->path_ = source.display();
  GT_RETURN_IF_ERROR(r->OpenWindow(source));
  GT_RETURN_IF_ERROR(r->ReadFileHeader());
  GT_RETURN_IF_ERROR(r->ReadRunInfo());
  if (const auto& t = options.table;
      t && t->model_fingerprint() == r->run_.model_fingerprint() && t->params_size() == r->run_.params_size()) {
    r->shared_table_ = t;
    // Swapped out to be freed: clear() keeps the elements allocated for reuse.
    google::protobuf::RepeatedPtrField<pb::ParamInfo>().Swap(r->run_.mutable_params());
    google::protobuf::RepeatedPtrField<pb::ProcessGroup>().Swap(r->run_.mutable_groups());
  }
  if (options.use_index) r->TryLoadIndex();
  return r;
}

Status TraceReader::OpenWindow(const TraceSource& source) {
  const std::string& path = path_;
  // Regression (issue 20): a FIFO named rank-00001.gtrace blocked fopen() forever.
  // Opened through the pool (file_pool.h): closed when other readers need the slot, reopened on the next read.
  file_ = std::make_unique<PooledFile>(source.path, path);
  auto lease = file_->Acquire();
  if (!lease.ok()) return lease.status();
  const uint64_t real_size = file_->size();
  if (source.offset > real_size || source.size.value_or(0) > real_size - source.offset) {
    return Status::Truncated(path + ": window [" + std::to_string(source.offset) + ", +" +
                             std::to_string(source.size.value_or(0)) + ") runs past the end of " + source.path + " (" +
                             std::to_string(real_size) + " bytes)");
  }
  base_ = source.offset;
  file_size_ = source.size.value_or(real_size - source.offset);
  end_of_frames_ = file_size_;
  if (ThreadDctx() == nullptr) return Status::IoError(path + ": cannot create a zstd context");
  return Status::Ok();
}

Status TraceReader::ReadFileHeader() {
  if (file_size_ < format::kFileHeaderSize) {
    return Status::Truncated(Where(0) + (file_size_ == 0
                                             ? std::string("empty file")
                                             : "truncated file header: " + std::to_string(file_size_) + " of " +
                                                   std::to_string(format::kFileHeaderSize) + " bytes"));
  }
  uint8_t h[format::kFileHeaderSize];
  GT_RETURN_IF_ERROR(ReadBytesAt(0, h, sizeof h, Where(0)));
  if (std::memcmp(h, format::kFileMagic, 8) != 0)
    return Status::Corruption(Where(0) + "bad magic: not a gradtrace file");
  const uint16_t major = frame_io::GetU16(h + 8);
  const uint16_t minor = frame_io::GetU16(h + 10);
  const uint32_t flags = frame_io::GetU32(h + 12);
  const std::string version = std::to_string(major) + "." + std::to_string(minor);
  const std::string ours = std::to_string(format::kMajorVersion) + "." + std::to_string(format::kMinorVersion);
  if (major > format::kMajorVersion) {
    return Status::InvalidArgument(Where(8) + "format version " + version + " is newer than this reader's " + ours +
                                   ": read it with a newer gradtrace");
  }
  if (major < format::kMajorVersion) {
    return Status::InvalidArgument(Where(8) + "format version " + version + " is not supported (this reader reads " +
                                   std::to_string(format::kMajorVersion) + ".x)");
  }
  newer_minor_ = minor > format::kMinorVersion;
  minor_ = minor;
  if ((flags & ~format::kKnownFlags) != 0 && !newer_minor_) {
    return Status::Corruption(Where(12) + "unknown header flags " + Hex(flags) + " in a version " + version + " file");
  }
  indexed_flag_ = (flags & format::kFlagIndexed) != 0;
  return Status::Ok();
}

Status TraceReader::ReadRunInfo() {
  RawFrame run;
  uint64_t next = 0;
  GT_RETURN_IF_ERROR(ReadRaw(format::kFileHeaderSize, file_size_, &run, &next));
  const uint64_t at = format::kFileHeaderSize;
  if (run.type != kRunInfo) {
    return Status::Corruption(Where(at) + "first frame has type " + std::to_string(run.type) + ", expected RunInfo (" +
                              std::to_string(kRunInfo) + ")");
  }
  if (Status s = ParseBounded(run.payload, ParseLimitsFor(format::FrameType::kRunInfo), &run_); !s.ok()) {
    return At(Where(at), s);
  }
  if (Status s = ValidateRunInfo(run_); !s.ok()) return At(Where(at), s);
  stored_bytes_ += run.stored_len;
  raw_bytes_ += run.raw_len;
  first_data_offset_ = pos_ = next;
  return Status::Ok();
}

Status TraceReader::ReadStoredRaw(uint64_t offset, uint64_t limit, uint8_t* hb, std::string* stored, uint64_t* next) {
  // Bytes past `limit` belong to the index when limit < file size: a frame
  // running into them is corrupt, not cut short.
  auto short_of = [&](const std::string& what) {
    return limit < file_size_
               ? Status::Corruption(Where(offset) + what + " before the index at offset " + std::to_string(limit))
               : Status::Truncated(Where(offset) + "truncated " + what);
  };
  if (offset > limit || limit - offset < format::kFrameHeaderSize) {
    return short_of("frame header: " + std::to_string(offset > limit ? 0 : limit - offset) + " of " +
                    std::to_string(format::kFrameHeaderSize) + " bytes");
  }
  GT_RETURN_IF_ERROR(ReadBytesAt(offset, hb, format::kFrameHeaderSize, Where(offset)));
  const frame_io::FrameHeader h = frame_io::FrameHeader::Decode(hb);
  if (Status s = CheckDeclaredSizes(h); !s.ok()) return At(Where(offset), s);
  const uint64_t left = limit - offset - format::kFrameHeaderSize;
  if (left < h.stored_len) {
    return short_of("frame payload: " + std::to_string(left) + " of " + std::to_string(h.stored_len) + " bytes");
  }
  SizeBuffer(stored, h.stored_len);
  GT_RETURN_IF_ERROR(ReadBytesAt(offset + format::kFrameHeaderSize, stored->data(), stored->size(), Where(offset)));
  *next = offset + format::kFrameHeaderSize + h.stored_len;
  return Status::Ok();
}

Status TraceReader::DecodeRaw(uint64_t offset, const uint8_t* hb, std::string& stored, bool keep_stored,
                              RawFrame* out) {
  const frame_io::FrameHeader h = frame_io::FrameHeader::Decode(hb);
  out->type = h.type;
  out->stored_len = h.stored_len;
  out->raw_len = h.raw_len;
  return DecodeBytes(offset, hb, stored, keep_stored, &out->payload);
}

Status TraceReader::DecodeBytes(uint64_t offset, const uint8_t* hb, std::string& stored, bool keep_stored,
                                std::string* payload) {
  const frame_io::FrameHeader h = frame_io::FrameHeader::Decode(hb);
  if (Status s = CheckFrame(hb, h, stored, newer_minor_); !s.ok()) return At(Where(offset), s);
  std::string copy;  // DecodePayload takes an uncompressed payload's bytes: kept, it decodes a copy
  std::string* in = &stored;
  if (keep_stored && static_cast<format::Codec>(h.codec) == format::Codec::kNone) in = &(copy = stored);
  if (Status s = DecodePayload(h, *in, ThreadDctx(), payload); !s.ok()) return At(Where(offset), s);
  return Status::Ok();
}

Status TraceReader::ReadRaw(uint64_t offset, uint64_t limit, RawFrame* out, uint64_t* next) {
  // Buffers are reused across frames (a fresh allocation per frame costs more
  // in page faults than the decompression itself), one per thread for all
  // readers: a trace set of many ranks has a reader per file, and buffers per
  // reader would multiply memory by the number of files.
  thread_local std::string stored;
  uint8_t hb[format::kFrameHeaderSize];
  GT_RETURN_IF_ERROR(ReadStoredRaw(offset, limit, hb, &stored, next));
  return DecodeRaw(offset, hb, stored, false, out);
}

Status TraceReader::ReadFrameAt(uint64_t offset, Frame* frame, uint64_t* next) {
  thread_local RawFrame raw;  // per thread, as ReadRaw's buffer
  GT_RETURN_IF_ERROR(ReadRaw(offset, end_of_frames_, &raw, next));
  return ParseRaw(offset, raw, frame);
}

Status TraceReader::ParseRaw(uint64_t offset, const RawFrame& raw, Frame* frame) {
  frame->offset = offset;
  frame->type = raw.type;
  frame->stored_len = raw.stored_len;
  frame->raw_len = raw.raw_len;
  frame->step.reset();
  frame->bucket.reset();
  switch (raw.type) {
    case kRunInfo:
      return Status::Corruption(Where(offset) + "unexpected RunInfo frame (only the first frame may be RunInfo)");
    case kStepInfo:
      frame->step = std::make_unique<pb::StepInfo>();
      if (Status s = ParseBounded(raw.payload, ParseLimitsFor(format::FrameType::kStepInfo), frame->step.get());
          !s.ok()) {
        frame->step.reset();
        return At(Where(offset), s);
      }
      return Status::Ok();
    case kBucketRecord: {
      auto rec = std::make_unique<pb::BucketRecord>();
      if (Status s = ParseBounded(raw.payload, ParseLimitsFor(format::FrameType::kBucketRecord), rec.get()); !s.ok()) {
        return At(Where(offset), s);
      }
      if (rec->values_from() != 0) {  // 1.6: the values are those of an earlier frame
        thread_local std::string payload, skeleton;
        thread_local pb::BucketRecord target;
        thread_local std::vector<std::string_view> data;
        GT_RETURN_IF_ERROR(ReadValuesFrom(offset, *rec, nullptr, &payload, &skeleton, &target, &data));
        for (int i = 0; i < rec->slices_size(); ++i) {
          pb::FullPayload* full = rec->mutable_slices(i)->mutable_full();
          full->set_data(std::string(data[static_cast<size_t>(i)]));
          full->set_shuffled(target.slices(i).full().shuffled());
        }
      }
      if (Status s = ValidateBucketRecord(table(), *rec); !s.ok())
        return Status::Corruption(Where(offset) + s.message());
      frame->bucket = std::move(rec);
      return Status::Ok();
    }
    default:  // kIndex, or a type from a newer minor version: nothing to parse here
      return Status::Ok();
  }
}

namespace {

// `payload` as a writer lays a bucket record out (record_view.h): split, its skeleton parsed into *record within the
// bucket record limits, one data view per slice. False: not that shape (outputs unusable).
bool ParseSplit(const std::string& payload, std::string* skeleton, pb::BucketRecord* record,
                std::vector<std::string_view>* data) {
  record->Clear();
  return SplitFullData(payload, skeleton, data) &&
         ParseBounded(*skeleton, ParseLimitsFor(format::FrameType::kBucketRecord), record).ok() &&
         data->size() == static_cast<size_t>(record->slices_size());
}

// A resolved reference's slices take the bytes `data` views in its target and the target's shuffle flags.
void TakeTargetValues(const pb::BucketRecord& target, std::vector<std::string_view>* data, pb::BucketRecord* record,
                      std::vector<std::string_view>* record_data) {
  record_data->swap(*data);
  for (int i = 0; i < record->slices_size(); ++i) {
    record->mutable_slices(i)->mutable_full()->set_shuffled(target.slices(i).full().shuffled());
  }
}

}  // namespace

Status TraceReader::ReadValuesFrom(uint64_t offset, const pb::BucketRecord& ref,
                                   const std::vector<std::string_view>* ref_data, std::string* payload,
                                   std::string* skeleton, pb::BucketRecord* target, std::vector<std::string_view>* data,
                                   bool keep_target) {
  const uint64_t from = ref.values_from();
  const std::string where = Where(offset) + "values_from " + std::to_string(from) + ": ";
  if (const std::string why = ValuesFromPlaceProblem(offset, from); !why.empty()) {
    return Status::Corruption(where + why);
  }
  // The header first: the type, and the size against the budget before anything is decoded.
  uint8_t hb[format::kFrameHeaderSize];
  GT_RETURN_IF_ERROR(ReadBytesAt(from, hb, sizeof hb, where));
  const frame_io::FrameHeader h = frame_io::FrameHeader::Decode(hb);
  if (h.type != kBucketRecord) return Status::Corruption(where + "not a bucket record frame");
  // A reference of a few bytes costs a decode of up to 64 MiB: bounded over the reader's life, so that a
  // hostile file of references cannot make it decode without end (FORMAT.md 4.3).
  const uint64_t budget = format::kReferenceDecodeFactor * file_size_ + format::kReferenceDecodeSlack;
  reference_bytes_ += CheckDeclaredSizes(h).ok() ? h.raw_len : 0;  // a size past the limits: refused below
  if (reference_bytes_ > budget) {
    return Status::LimitExceeded(where + "references have decoded " + std::to_string(reference_bytes_) +
                                 " bytes, more than " + std::to_string(format::kReferenceDecodeFactor) +
                                 " times the trace's size plus " + std::to_string(format::kReferenceDecodeSlack >> 20) +
                                 " MiB");
  }
  // In one pass as ReadView reads (the frame must end before the reference); the two steps for their messages.
  KeptTarget* kept = keep_target ? &LastTargetRead() : nullptr;
  if (kept != nullptr) kept->reader = 0;
  if (ReadPieces(from, offset, payload, kept != nullptr ? &kept->stored : nullptr)) {
    if (kept != nullptr) kept->reader = serial_, kept->from = from;
  } else {
    thread_local std::string stored;  // not ReadRaw's buffer: DecodeStored's caller may be reading with it
    uint64_t next = 0;
    if (Status s = ReadStoredRaw(from, offset, hb, &stored, &next); !s.ok()) {
      return s.code() == Status::Code::kIoError ? s : Status::Corruption(where + s.message());
    }
    if (Status s = DecodeBytes(from, hb, stored, false, payload); !s.ok()) {
      return Status::Corruption(where + s.message());
    }
  }
  // Only the writer's shape (record_view.h): references are new in 1.6, and only a writer makes them.
  if (!ParseSplit(*payload, skeleton, target, data)) {
    return Status::Corruption(where + "not a bucket record as a writer lays it out");
  }
  return CheckValuesFrom(where, ref, ref_data, *target, data);
}

Status TraceReader::CheckValuesFrom(const std::string& where, const pb::BucketRecord& ref,
                                    const std::vector<std::string_view>* ref_data, const pb::BucketRecord& target,
                                    const std::vector<std::string_view>* data) const {
  if (const std::string why = ValuesFromMismatch(ref, ref_data, target); !why.empty()) {
    return Status::Corruption(where + why);
  }
  if (Status s = ValidateBucketRecord(table(), target, data); !s.ok()) return Status::Corruption(where + s.message());
  return Status::Ok();
}

bool TraceReader::ReadReferenceOnto(uint64_t offset, RecordView* out, Status* st) {
  const uint64_t from = out->frame_offset_;
  // Only a small bucket record frame can be a reference (one short entry per slice): the header first, so that a
  // frame of values is not read twice.
  uint8_t hb[format::kFrameHeaderSize];
  if (offset > end_of_frames_ || end_of_frames_ - offset < sizeof hb || !ReadBytesAt(offset, hb, sizeof hb, "").ok()) {
    return false;
  }
  const frame_io::FrameHeader h = frame_io::FrameHeader::Decode(hb);
  if (h.type != kBucketRecord || h.raw_len > kReferenceOntoLimit) return false;
  thread_local StoredFrame stored;
  thread_local std::string payload, skeleton;
  thread_local pb::BucketRecord ref;
  thread_local std::vector<std::string_view> ref_data;
  if (!ReadStoredAt(offset, &stored).ok() || !DecodeBytes(offset, stored.header, stored.bytes, true, &payload).ok() ||
      !ParseSplit(payload, &skeleton, &ref, &ref_data) || ref.values_from() != from) {
    return false;  // any failure is the usual way's to report
  }
  const std::string where = Where(offset) + "values_from " + std::to_string(from) + ": ";
  if (const std::string why = ValuesFromPlaceProblem(offset, from); !why.empty()) {
    *st = Status::Corruption(where + why);
    return true;
  }
  // The view's frame becomes the target: its buffers move, and its bytes are viewed again where they now are.
  out->held_ = 0;
  out->payload_.swap(out->target_payload_);
  out->skeleton_.swap(out->target_skeleton_);
  out->record_.Swap(&out->target_record_);
  out->frame_reader_ = 0;
  std::vector<std::string_view> data;
  if (!SplitFullData(out->target_payload_, &out->target_skeleton_, &data) ||
      data.size() != static_cast<size_t>(out->target_record_.slices_size())) {
    *st = Status::Corruption(where + "not a bucket record as a writer lays it out");
    return true;
  }
  if (*st = CheckValuesFrom(where, ref, &ref_data, out->target_record_, &data); !st->ok()) return true;
  out->payload_.assign(payload);
  out->skeleton_.assign(skeleton);
  out->record_.Swap(&ref);
  TakeTargetValues(out->target_record_, &data, &out->record_, &out->data_);
  if (Status s = ValidateBucketRecord(table(), out->record_, &out->data_); !s.ok()) {
    *st = Status::Corruption(Where(offset) + s.message());
    return true;
  }
  *st = Status::Ok();
  return true;
}

std::string TraceReader::ValuesFromPlaceProblem(uint64_t offset, uint64_t from) const {
  if (from < first_data_offset_ || from >= offset || offset - from < format::kFrameHeaderSize) {
    return "not an earlier data frame";
  }
  if (has_index_) {  // an indexed trace lists every frame: the target must start one
    const auto& entries = index_.entries();
    const auto it = std::lower_bound(entries.begin(), entries.end(), from,
                                     [](const pb::IndexEntry& e, uint64_t o) { return e.offset() < o; });
    if (it == entries.end() || it->offset() != from || it->type() != kBucketRecord) {
      return "the index lists no bucket record frame there";
    }
  }
  return "";
}

std::string TraceReader::IndexEntriesProblem(const pb::Index& part, int64_t before, uint64_t index_offset,
                                             uint64_t* prev) const {
  for (int i = 0; i < part.entries_size(); ++i) {
    const pb::IndexEntry& e = part.entries(i);
    auto entry = [&] { return "index entry " + std::to_string(before + i); };
    // Entries point at data frames, strictly ascending.
    if (e.offset() < first_data_offset_ || e.offset() >= index_offset) {
      return entry() + " points at offset " + std::to_string(e.offset()) + ", outside the data frames [" +
             std::to_string(first_data_offset_) + ", " + std::to_string(index_offset) + ")";
    }
    if (before + i > 0 && e.offset() <= *prev) {
      return entry() + " (offset " + std::to_string(e.offset()) + ") is not after the previous one (offset " +
             std::to_string(*prev) + ")";
    }
    *prev = e.offset();
    // Catalogued param ids: distinct, ascending, inside the parameter table.
    int32_t last_id = -1;
    for (int32_t id : e.param_ids()) {
      if (id <= last_id || id >= table().params_size()) {
        return entry() + " lists parameter id " + std::to_string(id) + " (table has " +
               std::to_string(table().params_size()) + ", ids ascending)";
      }
      last_id = id;
    }
  }
  return "";
}

bool TraceReader::TryLoadIndex() {
  // Any doubt about the index means scanning: the scan then reports what is
  // wrong with the index frames or the footer at their offsets.
  if (file_size_ < first_data_offset_ + format::kFrameHeaderSize + format::kFooterSize) return false;
  const uint64_t footer = file_size_ - format::kFooterSize;
  uint8_t fb[format::kFooterSize];
  if (!ReadBytesAt(footer, fb, sizeof fb, "").ok() || std::memcmp(fb + 8, format::kFooterMagic, 8) != 0) return false;
  const uint64_t index_offset = frame_io::GetU64(fb);
  if (index_offset < first_data_offset_ || index_offset > footer - format::kFrameHeaderSize) return false;
  pb::Index merged;
  uint64_t prev = 0;
  for (uint64_t off = index_offset; off < footer;) {
    RawFrame raw;
    uint64_t next = 0;
    if (!ReadRaw(off, footer, &raw, &next).ok() || raw.type != kIndex) return false;
    pb::Index part;
    if (Status s = ParseBounded(raw.payload, ParseLimitsFor(format::FrameType::kIndex), &part); !s.ok()) {
      // Kept for VerifyFile: scanning does not parse index frames, so it would not see this.
      index_status_ = At(Where(off), s);
      return false;
    }
    // From here on the frames are sound but what they say is not: the scan
    // cannot see that, so the reason is kept for VerifyFile.
    std::string problem;
    if (merged.entries_size() + static_cast<int64_t>(part.entries_size()) > format::kMaxIndexEntries) {
      problem = "index lists more than " + std::to_string(format::kMaxIndexEntries) + " entries";
    } else {
      problem = IndexEntriesProblem(part, merged.entries_size(), index_offset, &prev);
    }
    if (!problem.empty()) {
      index_status_ = Status::Corruption(Where(off) + problem + ": index ignored");
      return false;
    }
    merged.mutable_entries()->MergeFrom(part.entries());
    off = next;
  }
  index_ = std::move(merged);
  has_index_ = true;
  end_of_frames_ = index_offset;
  return true;
}

Status TraceReader::ScanEnd(uint64_t offset) {
  const uint64_t left = file_size_ - offset;
  if (left < format::kFooterSize) {
    return Status::Truncated(Where(offset) + "truncated footer: " + std::to_string(left) + " of " +
                             std::to_string(format::kFooterSize) + " bytes");
  }
  uint8_t fb[format::kFooterSize];
  GT_RETURN_IF_ERROR(ReadBytesAt(offset, fb, sizeof fb, Where(offset)));
  if (std::memcmp(fb + 8, format::kFooterMagic, 8) != 0) return Status::Corruption(Where(offset) + "bad footer magic");
  if (frame_io::GetU64(fb) != index_run_offset_) {
    return Status::Corruption(Where(offset) + "footer points at offset " + std::to_string(frame_io::GetU64(fb)) +
                              ", but the index starts at offset " + std::to_string(index_run_offset_));
  }
  return Status::Ok();
}

bool TraceReader::Next(Frame* frame) {
  while (!done_) {
    if (pos_ >= end_of_frames_) {
      // Clean end of an indexed file, or a scan that reached the end of the file.
      if (!has_index_ && last_was_index_) {
        status_ = Status::Truncated(Where(pos_) + "file ends after the index without its footer");
      } else if (!has_index_ && indexed_flag_) {
        status_ = Status::Truncated(
            Where(pos_) +
            "file ends without index and footer: the writer did not finish (a crash, a write error such as a "
            "full disk, or a cut)");
      }
      break;
    }
    if (!has_index_ && last_was_index_ && file_size_ - pos_ <= format::kFooterSize) {
      status_ = ScanEnd(pos_);
      break;
    }
    uint64_t next = 0;
    if (Status s = ReadFrameAt(pos_, frame, &next); !s.ok()) {
      status_ = s;
      break;
    }
    stored_bytes_ += frame->stored_len;
    raw_bytes_ += frame->raw_len;
    const uint64_t at = pos_;
    pos_ = next;
    if (frame->type == kIndex) {
      if (!last_was_index_) index_run_offset_ = at;
      last_was_index_ = true;
      continue;
    }
    if (last_was_index_) {
      status_ = Status::Corruption(Where(at) + "data frame after the index");
      pos_ = at;
      break;
    }
    return true;
  }
  done_ = true;
  stop_offset_ = pos_;
  return false;
}

Status TraceReader::CheckDataOffset(uint64_t offset) const {
  if (offset < first_data_offset_ || offset >= end_of_frames_) {
    return Status::InvalidArgument(Where(offset) + "not inside the data frames [" + std::to_string(first_data_offset_) +
                                   ", " + std::to_string(end_of_frames_) + ")");
  }
  return Status::Ok();
}

Status TraceReader::ReadAt(uint64_t offset, Frame* frame) {
  GT_RETURN_IF_ERROR(CheckDataOffset(offset));
  uint64_t next = 0;
  return ReadFrameAt(offset, frame, &next);
}

Status TraceReader::ReadStoredAt(uint64_t offset, StoredFrame* out) {
  GT_RETURN_IF_ERROR(CheckDataOffset(offset));
  out->offset = offset;
  uint64_t next = 0;
  return ReadStoredRaw(offset, end_of_frames_, out->header, &out->bytes, &next);
}

Status TraceReader::DecodeStored(StoredFrame& stored, Frame* frame) {
  thread_local RawFrame raw;  // per thread, as ReadRaw's buffer
  GT_RETURN_IF_ERROR(DecodeRaw(stored.offset, stored.header, stored.bytes, true, &raw));
  return ParseRaw(stored.offset, raw, frame);
}

Status TraceReader::DecodeStoredView(StoredFrame& stored, RecordView* out) { return DecodeView(stored, out, false); }

Status TraceReader::DecodeView(StoredFrame& stored, RecordView* out, bool keep_target) {
  const uint64_t offset = stored.offset;
  out->frame_reader_ = 0;
  GT_RETURN_IF_ERROR(DecodeBytes(offset, stored.header, stored.bytes, true, &out->payload_));
  if (frame_io::FrameHeader::Decode(stored.header).type != kBucketRecord) {
    return Status::InvalidArgument(Where(offset) + "not a bucket record frame");
  }
  return ParseView(offset, out, keep_target);
}

Status TraceReader::ParseView(uint64_t offset, RecordView* out, bool keep_target) {
  const ParseLimits limits = ParseLimitsFor(format::FrameType::kBucketRecord);
  out->frame_reader_ = 0;
  out->held_ = 0;
  // The skeleton parses where the payload does (only lengths differ); where it does not, or the payload is not the
  // shape SplitFullData takes, the payload is parsed whole: protobuf's results and messages.
  const bool split = ParseSplit(out->payload_, &out->skeleton_, &out->record_, &out->data_);
  if (!split) {
    out->record_.Clear();
    if (Status s = ParseBounded(out->payload_, limits, &out->record_); !s.ok()) return At(Where(offset), s);
    out->data_.assign(static_cast<size_t>(out->record_.slices_size()), std::string_view());
    for (int i = 0; i < out->record_.slices_size(); ++i) out->data_[i] = out->record_.slices(i).full().data();
  }
  if (out->record_.values_from() != 0) {  // 1.6: the values are viewed in the earlier frame's payload
    std::vector<std::string_view> data;
    GT_RETURN_IF_ERROR(ReadValuesFrom(offset, out->record_, &out->data_, &out->target_payload_, &out->target_skeleton_,
                                      &out->target_record_, &data, keep_target));
    TakeTargetValues(out->target_record_, &data, &out->record_, &out->data_);
  }
  if (Status s = ValidateBucketRecord(table(), out->record_, &out->data_); !s.ok()) {
    return Status::Corruption(Where(offset) + s.message());
  }
  if (split && out->record_.values_from() == 0) out->frame_reader_ = serial_, out->frame_offset_ = offset;
  return Status::Ok();
}

Status TraceReader::ReadView(uint64_t offset, RecordView* out, StoredFrame* keep) {
  GT_RETURN_IF_ERROR(CheckDataOffset(offset));
  // A caller keeping the stored bytes compares copies with them (SameRecord): a reference's target's are kept too.
  const bool keep_target = keep != nullptr;
  if (!keep_target && out->frame_reader_ == serial_ && out->frame_offset_ < offset) {
    Status st;
    if (ReadReferenceOnto(offset, out, &st)) return st;
  }
  out->frame_reader_ = 0;  // its payload is overwritten from here on
  if (ReadViewPieces(offset, out, keep)) return ParseView(offset, out, keep_target);
  thread_local StoredFrame scratch;
  StoredFrame& stored = keep != nullptr ? *keep : scratch;
  GT_RETURN_IF_ERROR(ReadStoredAt(offset, &stored));
  return DecodeView(stored, out, keep_target);
}

bool TraceReader::ReadViewPieces(uint64_t offset, RecordView* out, StoredFrame* keep) {
  return ReadPieces(offset, end_of_frames_, &out->payload_, keep);
}

bool TraceReader::ReadPieces(uint64_t offset, uint64_t limit, std::string* payload, StoredFrame* keep) {
  // A piece well inside L2, a few zstd blocks (128 KiB each) long.
  constexpr size_t kPiece = size_t{192} << 10;
  auto lease = file_->Acquire();  // held through the pieces: the fd stays open
  if (!lease.ok()) return false;
  const int fd = lease->fd();
  uint8_t hb[format::kFrameHeaderSize];
  if (offset > limit || limit - offset < sizeof hb ||
      pread(fd, hb, sizeof hb, static_cast<off_t>(base_ + offset)) != static_cast<ssize_t>(sizeof hb)) {
    return false;
  }
  const frame_io::FrameHeader h = frame_io::FrameHeader::Decode(hb);
  // Only what the writer makes of a bucket record: everything else is the two-step way's to judge.
  if (!CheckDeclaredSizes(h).ok() || limit - offset - sizeof hb < h.stored_len || h.type != kBucketRecord ||
      h.reserved != 0 || static_cast<format::Codec>(h.codec) != format::Codec::kZstd || h.stored_len < 4) {
    return false;
  }
  if (keep != nullptr) {
    keep->offset = offset;
    std::memcpy(keep->header, hb, sizeof hb);
    SizeBuffer(&keep->bytes, h.stored_len);
  }
  ZSTD_DCtx* ctx = ThreadDctx();
  if (ctx == nullptr) return false;
  ZSTD_DCtx_reset(ctx, ZSTD_reset_session_only);
  // zstd writes straight into the payload (no window buffer of its own, no copy out of it).
  // A zstd refusing it decodes through its window instead: the same bytes, one copy more.
  ZSTD_DCtx_setParameter(ctx, ZSTD_d_stableOutBuffer, 1);
  struct Restore {  // the one-shot path (DecompressZstd) shares the context
    ZSTD_DCtx* ctx;
    ~Restore() { ZSTD_DCtx_reset(ctx, ZSTD_reset_session_and_parameters); }
  } restore{ctx};
  thread_local std::string piece;
  SizeBuffer(&piece, kPiece);
  const uint32_t header_crc = crc32c::Value(hb + frame_io::kCrcCoveredHeaderOffset,
                                            format::kFrameHeaderSize - frame_io::kCrcCoveredHeaderOffset);
  // Raw blocks read into place (zstd_blocks.h); a frame it does not take, the streaming way below.
  SizeBuffer(payload, h.raw_len);
  uint32_t block_crc = header_crc;
  if (ReadZstdBlocks(fd, base_ + offset + sizeof hb, h.stored_len, ctx, payload->data(), h.raw_len, &block_crc, &piece,
                     keep != nullptr ? keep->bytes.data() : nullptr) &&
      crc32c::Mask(block_crc) == h.masked_crc) {
    return true;
  }
  ZSTD_DCtx_reset(ctx, ZSTD_reset_session_only);
  uint32_t crc = header_crc;
  ZSTD_outBuffer to{nullptr, 0, 0};
  bool frame_done = false;
  for (uint64_t at = 0; at < h.stored_len;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kPiece, h.stored_len - at));
    const off_t where = static_cast<off_t>(base_ + offset + sizeof hb + at);
    if (pread(fd, piece.data(), n, where) != static_cast<ssize_t>(n)) return false;
    if (at == 0) {
      // DecompressZstd's checks before decompressing: a data frame whose content size is raw_len.
      if (IsSkippableZstdFrame(piece) ||
          ZSTD_getFrameContentSize(piece.data(), n) != static_cast<unsigned long long>(h.raw_len)) {
        return false;
      }
      to = {payload->data(), payload->size(), 0};  // sized for the block walk above
    }
    crc = crc32c::Extend(crc, piece.data(), n);
    if (keep != nullptr) std::memcpy(keep->bytes.data() + at, piece.data(), n);
    ZSTD_inBuffer from{piece.data(), n, 0};
    while (from.pos < from.size) {
      if (frame_done) return false;  // bytes after the frame: not exactly one zstd frame
      const size_t in_before = from.pos, out_before = to.pos;
      const size_t r = ZSTD_decompressStream(ctx, &to, &from);
      if (ZSTD_isError(r)) return false;
      frame_done = r == 0;
      if (!frame_done && from.pos == in_before && to.pos == out_before) return false;  // no progress: output full
    }
    at += n;
  }
  return frame_done && to.pos == to.size && crc32c::Mask(crc) == h.masked_crc;
}

Status TraceReader::ParseStored(const StoredFrame& stored, pb::BucketRecord* out) {
  if (frame_io::FrameHeader::Decode(stored.header).type != kBucketRecord) {
    return Status::InvalidArgument(Where(stored.offset) + "not a bucket record frame");
  }
  thread_local std::string payload;
  // keep_stored: the stored bytes are read, never taken or changed.
  GT_RETURN_IF_ERROR(DecodeBytes(stored.offset, stored.header, const_cast<std::string&>(stored.bytes), true, &payload));
  out->Clear();
  if (Status s = ParseBounded(payload, ParseLimitsFor(format::FrameType::kBucketRecord), out); !s.ok()) {
    return At(Where(stored.offset), s);
  }
  return Status::Ok();
}

TraceReader::KeptTarget& TraceReader::LastTargetRead() {
  thread_local KeptTarget kept;
  return kept;
}

bool TraceReader::SameRecord(TraceReader& a, const StoredFrame& sa, uint64_t from_a, TraceReader& b,
                             const StoredFrame& sb) {
  if (from_a == 0) return sa.SameBytes(sb);
  uint64_t from_b = from_a;
  if (!sa.SameBytes(sb)) {
    // Records that differ in values_from alone serialize to lengths at most a varint's apart.
    constexpr uint32_t kVarint = 10;
    const frame_io::FrameHeader ha = frame_io::FrameHeader::Decode(sa.header);
    const frame_io::FrameHeader hb = frame_io::FrameHeader::Decode(sb.header);
    if (hb.raw_len > ha.raw_len + kVarint || ha.raw_len > hb.raw_len + kVarint) return false;
    thread_local pb::BucketRecord ra, rb;
    if (!a.ParseStored(sa, &ra).ok() || !b.ParseStored(sb, &rb).ok() || rb.values_from() == 0) return false;
    from_b = rb.values_from();
    if (WithoutValuesFrom(ra) != WithoutValuesFrom(rb)) return false;
  }
  // The first's target is read once for all its copies, if ReadView did not keep it when it decoded the first.
  KeptTarget& ta = LastTargetRead();
  if (ta.reader != a.serial_ || ta.from != from_a) {
    ta.reader = 0;
    if (!a.ReadStoredAt(from_a, &ta.stored).ok()) return false;
    ta.reader = a.serial_;
    ta.from = from_a;
  }
  thread_local StoredFrame tb;
  if (!b.ReadStoredAt(from_b, &tb).ok() || !ta.stored.SameBytes(tb)) return false;
  // Where b's reader would take it from: an earlier bucket record frame, ending before the reference.
  return b.ValuesFromPlaceProblem(sb.offset, from_b).empty() &&
         from_b + format::kFrameHeaderSize + tb.bytes.size() <= sb.offset;
}

Status VerifyFile(const std::string& path) { return VerifyFile(TraceSource::File(path)); }

Status VerifyFile(const TraceSource& source) {
  const std::string& path = source.display();
  Expected<std::unique_ptr<TraceReader>> opened = TraceReader::Open(source);
  if (!opened.ok()) return opened.status();
  TraceReader& r = **opened;
  std::vector<pb::IndexEntry> seen;
  Frame f;
  while (r.Next(&f)) {
    pb::IndexEntry e;
    if (f.step) {
      e = StepEntry(*f.step);
    } else if (f.bucket) {
      e = CatalogueEntry(*f.bucket);
      e.set_raw_len(f.raw_len);
    } else {
      continue;  // a frame type of a newer minor version: not a data frame, and indexes rightly omit it
    }
    e.set_offset(f.offset);
    e.set_type(f.type);
    seen.push_back(std::move(e));
  }
  if (!r.status().ok()) return r.status();
  if (!r.index_status().ok()) return r.index_status();
  if (!r.has_index()) return Status::Ok();
  const auto& entries = r.index().entries();
  for (size_t i = 0; i < seen.size() || i < static_cast<size_t>(entries.size()); ++i) {
    if (i >= seen.size() || i >= static_cast<size_t>(entries.size())) {
      return Status::Corruption(path + ": offset " + std::to_string(r.stop_offset()) + ": index lists " +
                                std::to_string(entries.size()) + " frames, the file holds " +
                                std::to_string(seen.size()));
    }
    const pb::IndexEntry& e = entries[static_cast<int>(i)];
    const pb::IndexEntry& s = seen[i];
    const std::string differs = EntryMismatch(e, s, r.minor_version());
    if (!differs.empty()) {
      return Status::Corruption(path + ": offset " + std::to_string(s.offset()) + ": index entry " + std::to_string(i) +
                                " (offset " + std::to_string(e.offset()) + ", type " + std::to_string(e.type()) +
                                ", step " + std::to_string(e.step()) + ") does not match the frame there: " + differs);
    }
  }
  return Status::Ok();
}

}  // namespace gradtrace
