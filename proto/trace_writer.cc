// Appends frames: header, masked CRC32C, zstd payload (format.h). Each frame
// is written with one fwrite pair and flushed, so a crash leaves a file whose
// complete frames all read back.
#include "trace_writer.h"

#include <fcntl.h>
#include <stdio_ext.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include "chunking.h"
#include "crc32c.h"
#include "format.h"
#include "frame_io.h"
#include "index_entry.h"
#include "slice_codec.h"
#include "trace_reader.h"
#include "validate.h"

namespace gradtrace {
namespace {

ZSTD_CCtx* Cctx(void* p) { return static_cast<ZSTD_CCtx*>(p); }

// " (run 'ID' of PRODUCER on HOST)" from the RunInfo of the trace at `path`, or "" when it does not read.
std::string RunOf(const std::string& path) {
  auto r = TraceReader::Open(path);
  if (!r.ok()) return "";
  const pb::RunInfo& run = (*r)->run_info();
  std::string s = " (run '" + run.run_id() + "'";
  if (!run.producer().empty()) s += " of " + run.producer();
  if (!run.host().empty()) s += " on " + run.host();
  return s + ")";
}

// `path` opened for writing as TraceWriter::Open's contract says: created exclusively (with `overwrite`, an
// existing regular file truncated once this process holds its lock), and locked until closed.
Expected<std::FILE*> CreateTraceFile(const std::string& path, bool overwrite) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  bool regular = true, truncate = false;
  if (fd < 0 && errno == EEXIST) {
    struct stat st;
    const bool known = ::stat(path.c_str(), &st) == 0;
    if (known && S_ISCHR(st.st_mode)) {
      regular = false;
      fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    } else if (known && !S_ISREG(st.st_mode)) {
      return Status::IoError(path + ": exists and is not a regular file");
    } else if (LockedByWriter(path)) {
      return Status::IoError(path + ": exists: another run is writing here now" + RunOf(path));
    } else if (!overwrite) {
      return Status::IoError(
          path + ": exists" + RunOf(path) +
          ": not replaced without overwrite (gradtrace-train --overwrite, overwrite=True in Python); "
          "or write to a new directory");
    } else {
      fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
      truncate = true;
    }
  }
  if (fd < 0) return Status::IoError(path + ": cannot create: " + std::strerror(errno));
  // The lock is what a later writer checks; released when the file is closed (or the process dies). On a
  // filesystem without flock (ENOLCK, EINVAL, ENOSYS) the exclusive create alone keeps writers apart.
  if (regular && ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    ::close(fd);  // another overwriting writer got here first
    return Status::IoError(path + ": exists: another run is writing here now" + RunOf(path));
  }
  if (truncate && ::ftruncate(fd, 0) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::IoError(path + ": cannot truncate: " + std::strerror(err));
  }
  std::FILE* f = ::fdopen(fd, "wb");
  if (f == nullptr) {
    const int err = errno;
    ::close(fd);
    return Status::IoError(path + ": cannot create: " + std::strerror(err));
  }
  return f;
}

}  // namespace

bool LockedByWriter(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  const bool locked = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);  // and with it the lock, if taken
  return locked;
}

TraceWriter::TraceWriter(std::string path, std::FILE* file, WriterOptions options)
    : path_(std::move(path)), file_(file), options_(options) {}

TraceWriter::~TraceWriter() {
  if (file_ != nullptr) std::fclose(file_);
  ZSTD_freeCCtx(Cctx(zstd_ctx_));
}

Expected<std::unique_ptr<TraceWriter>> TraceWriter::Open(const std::string& path, const pb::RunInfo& run,
                                                         const WriterOptions& options) {
  pb::RunInfo info = run;
  for (pb::ParamInfo& p : *info.mutable_params()) {
    if (p.numel() != 0) continue;
    int64_t n = 1;
    for (int64_t d : p.shape()) n *= d;
    p.set_numel(n);
  }
  if (info.model_fingerprint().empty()) info.set_model_fingerprint(ModelFingerprint(info));
  if (Status s = ValidateRunInfo(info); !s.ok())
    return Status::InvalidArgument(path + ": invalid RunInfo: " + s.message());

  auto created = CreateTraceFile(path, options.overwrite);
  if (!created.ok()) return created.status();
  std::unique_ptr<TraceWriter> w(new TraceWriter(path, *created, options));
  if (options.direct_io) w->direct_.Open(::fileno(*created));
  w->run_ = std::move(info);
  w->zstd_ctx_ = ZSTD_createCCtx();
  if (w->zstd_ctx_ == nullptr) return Status::IoError(path + ": cannot create a zstd context");
  ZSTD_CCtx_setParameter(Cctx(w->zstd_ctx_), ZSTD_c_compressionLevel, options.zstd_level);
  // Content size in every zstd frame header lets readers check it against raw_len.
  ZSTD_CCtx_setParameter(Cctx(w->zstd_ctx_), ZSTD_c_contentSizeFlag, 1);

  uint8_t header[format::kFileHeaderSize];
  std::memcpy(header, format::kFileMagic, 8);
  frame_io::PutU16(header + 8, format::kMajorVersion);
  frame_io::PutU16(header + 10, format::kMinorVersion);
  frame_io::PutU32(header + 12, options.write_index ? format::kFlagIndexed : 0);
  GT_RETURN_IF_ERROR(w->WriteRaw(header, sizeof header));
  w->offset_ = sizeof header;
  std::string payload;
  w->run_.SerializeToString(&payload);
  GT_RETURN_IF_ERROR(w->WriteFrame(static_cast<uint8_t>(format::FrameType::kRunInfo), payload, nullptr));
  return w;
}

Status TraceWriter::Fail(Status s) {
  if (error_.ok()) error_ = s;
  return error_;
}

void TraceWriter::CutBack(uint64_t offset) {
  if (file_ == nullptr) return;
  // The frame that failed may be partly written (a full disk takes what fits) and partly still in stdio's
  // buffer: drop the buffer, so that no later flush (at fclose) appends its bytes, and cut the file at the
  // end of the last complete frame (never longer than it is: the file header is flushed only with the
  // RunInfo frame). A character device has nothing to cut.
  __fpurge(file_);
  struct stat st;
  if (::fstat(::fileno(file_), &st) == 0 && S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > offset) {
    (void)!::ftruncate(::fileno(file_), static_cast<off_t>(offset));
  }
}

Status TraceWriter::WriteRaw(const void* data, size_t n) {
  if (n > 0 && std::fwrite(data, 1, n, file_) != n) {
    return Fail(
        Status::IoError(path_ + ": offset " + std::to_string(offset_) + ": write failed: " + std::strerror(errno)));
  }
  return Status::Ok();
}

Status TraceWriter::WriteStored(const char* data, size_t n, uint64_t at, bool placed) {
  const DirectWrites::Middle m = placed && direct_.enabled() ? DirectWrites::MiddleOf(at, n) : DirectWrites::Middle{};
  if (m.lo == m.hi) return WriteRaw(data, n);
  const auto fail = [&](const std::string& what, int err) {
    return Fail(Status::IoError(path_ + ": offset " + std::to_string(m.lo) + ": " + what + ": " + std::strerror(err)));
  };
  GT_RETURN_IF_ERROR(WriteRaw(data, m.lo - at));
  if (std::fflush(file_) != 0) return fail("flush failed", errno);
  const int err = direct_.Write(m);
  if (err == EINVAL) {  // the device wants another alignment: stdio from here on
    direct_.Disable();
    return WriteRaw(data + (m.lo - at), n - (m.lo - at));
  }
  if (err != 0) return fail("write failed", err);
  direct_bytes_ += m.hi - m.lo;
  if (::fseeko(file_, static_cast<off_t>(m.hi), SEEK_SET) != 0) return fail("seek failed", errno);
  return WriteRaw(data + (m.hi - at), at + n - m.hi);
}

Status TraceWriter::WriteFrame(uint8_t type, const std::string& payload, const pb::IndexEntry* entry) {
  if (!error_.ok()) return error_;
  if (closed_ || file_ == nullptr) return Status::InvalidArgument(path_ + ": write after Close()");
  if (payload.size() > format::kMaxFramePayload) {
    return Status::LimitExceeded(path_ + ": frame payload of " + std::to_string(payload.size()) +
                                 " bytes exceeds the limit of " + std::to_string(format::kMaxFramePayload));
  }
  // zstd when it saves space, else stored as is (codec 0): stored_len <= raw_len
  // always, so the stored size obeys the same limit. A large frame is compressed
  // into the direct writer's buffer, from where its middle goes to disk.
  std::string_view stored = payload;
  uint8_t codec = static_cast<uint8_t>(format::Codec::kNone);
  const size_t bound = ZSTD_compressBound(payload.size());
  const uint64_t payload_at = offset_ + format::kFrameHeaderSize;
  char* out = nullptr;
  if (payload.size() >= DirectWrites::kMinimum) out = direct_.Place(payload_at, bound);
  const bool placed = out != nullptr;
  if (!placed) {
    compressed_.resize(bound);
    out = compressed_.data();
  }
  const size_t z = ZSTD_compress2(Cctx(zstd_ctx_), out, bound, payload.data(), payload.size());
  if (!ZSTD_isError(z) && z < payload.size()) {
    stored = std::string_view(out, z);
    codec = static_cast<uint8_t>(format::Codec::kZstd);
  }
  frame_io::FrameHeader h;
  h.stored_len = static_cast<uint32_t>(stored.size());
  h.raw_len = static_cast<uint32_t>(payload.size());
  h.type = type;
  h.codec = codec;
  uint8_t hdr[format::kFrameHeaderSize];
  h.Encode(hdr);
  uint32_t crc = crc32c::Value(hdr + frame_io::kCrcCoveredHeaderOffset,
                               format::kFrameHeaderSize - frame_io::kCrcCoveredHeaderOffset);
  crc = crc32c::Extend(crc, stored.data(), stored.size());
  frame_io::PutU32(hdr + 8, crc32c::Mask(crc));

  const uint64_t frame_offset = offset_;
  Status written = WriteRaw(hdr, sizeof hdr);
  if (written.ok()) {
    written = WriteStored(stored.data(), stored.size(), payload_at,
                          placed && codec == static_cast<uint8_t>(format::Codec::kZstd));
  }
  if (written.ok() && std::fflush(file_) != 0) {
    written = Fail(Status::IoError(path_ + ": offset " + std::to_string(frame_offset) +
                                   ": flush failed: " + std::strerror(errno)));
  }
  if (!written.ok()) {
    CutBack(frame_offset);  // the file ends at the last complete frame: it reads as truncated, not corrupt
    return written;
  }
  offset_ += sizeof hdr + stored.size();
  raw_bytes_ += payload.size();
  if (entry != nullptr) {
    pb::IndexEntry* e = index_.add_entries();
    *e = *entry;
    e->set_offset(frame_offset);
    e->set_type(type);
    if (type == static_cast<uint8_t>(format::FrameType::kBucketRecord)) e->set_raw_len(h.raw_len);
  }
  return Status::Ok();
}

Status TraceWriter::WriteStep(const pb::StepInfo& step) {
  const pb::IndexEntry e = StepEntry(step);
  return WriteFrame(static_cast<uint8_t>(format::FrameType::kStepInfo), step.SerializeAsString(), &e);
}

namespace {

// A record's slices (each a `full` payload, empty, where it had one) and chunk fields, without values.
pb::BucketRecord SkeletonOf(const pb::BucketRecord& record) {
  pb::BucketRecord s;
  for (const pb::Slice& from : record.slices()) {
    pb::Slice* to = s.add_slices();
    to->set_param_id(from.param_id());
    to->set_offset(from.offset());
    to->set_count(from.count());
    to->set_dtype(from.dtype());
    if (from.has_full()) to->mutable_full();
  }
  s.set_chunk(record.chunk());
  s.set_chunk_count(record.chunk_count());
  s.set_last_slice_continues(record.last_slice_continues());
  return s;
}

}  // namespace

Status TraceWriter::WriteBucketFrame(const pb::BucketRecord& record, std::vector<WrittenFrame>* written) {
  const auto type = static_cast<uint8_t>(format::FrameType::kBucketRecord);
  const pb::IndexEntry e = CatalogueEntry(record);
  const uint64_t at = offset_;
  const std::string payload = record.SerializeAsString();
  GT_RETURN_IF_ERROR(WriteFrame(type, payload, &e));
  if (written != nullptr) {
    WrittenFrame& w = written->emplace_back();
    w.offset = at;
    w.stored_len = static_cast<uint32_t>(offset_ - at - format::kFrameHeaderSize);
    w.raw_len = static_cast<uint32_t>(payload.size());
    w.skeleton = SkeletonOf(record);
  }
  return Status::Ok();
}

Status TraceWriter::WriteBucketValuesOf(const pb::BucketRecord& meta, const std::vector<WrittenFrame>& targets) {
  if (!error_.ok()) return error_;
  auto refused = [&](const std::string& why) {
    return Status::InvalidArgument(path_ + ": bucket record by reference (step " + std::to_string(meta.step()) +
                                   ", bucket " + std::to_string(meta.bucket_id()) + "): " + why);
  };
  if (meta.slices_size() > 0) return refused("the record holds slices of its own");
  if (targets.empty()) return refused("no frame to take the values from");
  for (const WrittenFrame& t : targets) {
    if (t.offset < format::kFileHeaderSize || t.offset >= offset_ || t.skeleton.values_from() != 0) {
      return refused("offset " + std::to_string(t.offset) + " is not a bucket record frame written before");
    }
  }
  for (const WrittenFrame& t : targets) {
    pb::BucketRecord ref = meta;
    ref.mutable_slices()->CopyFrom(t.skeleton.slices());
    ref.set_chunk(t.skeleton.chunk());
    ref.set_chunk_count(t.skeleton.chunk_count());
    ref.set_last_slice_continues(t.skeleton.last_slice_continues());
    ref.set_values_from(t.offset);
    GT_RETURN_IF_ERROR(WriteBucketFrame(ref, nullptr));
  }
  return Status::Ok();
}

Status TraceWriter::WriteBucket(const pb::BucketRecord& record, std::vector<WrittenFrame>* written) {
  if (!error_.ok()) return error_;
  if (Status s = ValidateBucketRecord(run_, record); !s.ok()) {
    return Status::InvalidArgument(path_ + ": invalid bucket record (step " + std::to_string(record.step()) +
                                   ", bucket " + std::to_string(record.bucket_id()) + "): " + s.message());
  }
  if (record.values_from() != 0) {
    // A record read by reference holds its values (the reader resolved it): written as such, in full.
    pb::BucketRecord full = record;
    full.clear_values_from();
    return WriteBucket(full, written);
  }
  if (record.ByteSizeLong() <= format::kChunkTarget) return WriteBucketFrame(record, written);
  Expected<std::vector<pb::BucketRecord>> chunks = SplitRecord(record, format::kChunkTarget);
  if (!chunks.ok()) return Status::InvalidArgument(path_ + ": " + chunks.status().message());
  for (const pb::BucketRecord& c : *chunks) GT_RETURN_IF_ERROR(WriteBucketFrame(c, written));
  return Status::Ok();
}

Status TraceWriter::Close() {
  if (closed_) return close_status_;
  Status s = error_;
  if (s.ok() && options_.write_index) {
    const uint64_t index_offset = offset_;
    const auto type = static_cast<uint8_t>(format::FrameType::kIndex);
    const int total = index_.entries_size();
    // Always at least one index frame, so the footer has something to point at.
    // A frame ends at kIndexEntriesPerFrame entries or before kChunkTarget bytes.
    int i = 0;
    do {
      pb::Index part;
      size_t bytes = 0;
      for (; i < total && part.entries_size() < format::kIndexEntriesPerFrame; ++i) {
        const size_t n = index_.entries(i).ByteSizeLong() + 8;  // + field tag and length
        if (part.entries_size() > 0 && bytes + n > format::kChunkTarget) break;
        bytes += n;
        *part.add_entries() = index_.entries(i);
      }
      s = WriteFrame(type, part.SerializeAsString(), nullptr);
    } while (s.ok() && i < total);
    if (s.ok()) {
      uint8_t footer[format::kFooterSize];
      frame_io::PutU64(footer, index_offset);
      std::memcpy(footer + 8, format::kFooterMagic, 8);
      s = WriteRaw(footer, sizeof footer);
      if (s.ok()) offset_ += sizeof footer;
    }
    // An index or footer that did not fit is cut off with what it wrote: the file ends at its last data
    // frame (a truncated trace) rather than in a partial index.
    if (!s.ok()) CutBack(index_offset);
  }
  direct_.Disable();
  if (file_ != nullptr) {
    const bool flush_failed = std::fflush(file_) != 0;
    const int err = errno;
    const bool close_failed = std::fclose(file_) != 0;
    file_ = nullptr;
    if (s.ok() && (flush_failed || close_failed)) {
      s = Status::IoError(path_ + ": close failed: " + std::strerror(flush_failed ? err : errno));
    }
  }
  closed_ = true;
  close_status_ = s;
  return s;
}

}  // namespace gradtrace
