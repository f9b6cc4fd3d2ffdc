// TraceWriter: appends frames to one rank's trace file. Each frame is flushed
// as written, so a crash loses at most the frame in flight.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "direct_write.h"
#include "gradtrace.pb.h"
#include "status.h"

namespace gradtrace {

struct WriterOptions {
  int zstd_level = 1;       // level 3 compresses gradients ~1% better at ~1.4x the CPU (docs/dev/performance.md)
  bool write_index = true;  // index frame + footer at Close()
  // false (the default): Open refuses a `path` that exists. true: it replaces a
  // finished trace there -- never one another writer still holds open.
  bool overwrite = false;
  // Large frames' whole 4 KiB blocks written with O_DIRECT where the file
  // takes it (direct_write.h); the file's bytes are the same either way.
  bool direct_io = true;
};

// Whether a trace writer (of this process or another) holds `path`'s lock now:
// TraceWriter::Open takes it for as long as it writes. False where the file
// does not open or the filesystem has no flock.
bool LockedByWriter(const std::string& path);

// A bucket record frame as written: where it is, what it holds less its
// values (what a reference to it repeats) and its sizes.
struct WrittenFrame {
  uint64_t offset = 0;
  uint32_t stored_len = 0;
  uint32_t raw_len = 0;
  pb::BucketRecord skeleton;  // slices and chunk fields, no data
  // Worth referring to: its values compress less than 16 to 1. A reference
  // saves the bytes of its stored payload and costs readers a decode of its
  // raw ones; the ratio keeps a file's references within the readers' budget
  // (format.h kReferenceDecodeFactor), and highly compressible values cost
  // little to write again.
  bool referable() const { return raw_len <= 16 * uint64_t{stored_len}; }
};

class TraceWriter {
 public:
  // Creates `path` and writes the file header and the RunInfo frame.
  // Fills in what the caller may leave empty: ParamInfo.numel (from shape) and
  // RunInfo.model_fingerprint; then checks RunInfo (validate.h) and refuses an
  // invalid one with InvalidArgument. IoError names the path and errno text.
  // Two writers never share a file (two runs into one directory used to
  // interleave their frames and corrupt both, each exiting 0): `path` is
  // created exclusively, and the writer holds an exclusive lock (flock) on it
  // until it closes. So IoError "<path>: exists (run ...): not replaced
  // without overwrite (gradtrace-train --overwrite, overwrite=True in Python);
  // or write to a new directory" (naming the run in it when its RunInfo
  // reads), unless options.overwrite; and with it or without, IoError
  // "<path>: exists: another run is writing here now" while a writer holds
  // the lock. A character device
  // (/dev/null, /dev/full) is written as it is: it holds no trace to protect.
  static Expected<std::unique_ptr<TraceWriter>> Open(const std::string& path, const pb::RunInfo& run,
                                                     const WriterOptions& options = {});
  ~TraceWriter();  // closes without index if Close() was not called

  // Each write appends and flushes whole frames. After an I/O error (a full
  // disk: ENOSPC, EFBIG) the frame that failed is cut off again, so the file
  // ends at the last complete frame and reads as truncated, with every frame
  // before it; every later call returns that same error.
  Status WriteStep(const pb::StepInfo& step);
  // Records larger than a frame are split by slice ranges into several frames
  // (chunk/chunk_count set, chunking.h); readers see one BucketRecord per frame.
  // The record is checked against RunInfo first (InvalidArgument, nothing written).
  // `written`, when given, gets each frame written (one per chunk). A record
  // read by reference (values_from set, its values resolved) is written in
  // full, without values_from.
  Status WriteBucket(const pb::BucketRecord& record, std::vector<WrittenFrame>* written = nullptr);
  // Format 1.6 (FORMAT.md 4.3): a record whose values are those of frames
  // written before, `targets` as WriteBucket reported them: one reference
  // frame per target, each with `meta`'s fields but its slices (step, micro
  // step, bucket, phase, group, partition, divisor) and the target's slices
  // and chunk without their data. The caller vouches that the values are the
  // same bytes (the capture compares them). InvalidArgument, nothing written,
  // for a record with slices, no targets, or a target not WriteBucket's.
  Status WriteBucketValuesOf(const pb::BucketRecord& meta, const std::vector<WrittenFrame>& targets);
  // Writes the index frame and footer, flushes and closes. Idempotent: later
  // calls return the first call's result.
  Status Close();

  const std::string& path() const { return path_; }
  uint64_t bytes_written() const { return offset_; }
  uint64_t raw_bytes() const { return raw_bytes_; }  // serialized protobuf before zstd
  uint64_t direct_bytes() const { return direct_bytes_; }  // of bytes_written(), those written with O_DIRECT

 private:
  TraceWriter(std::string path, std::FILE* file, WriterOptions options);
  Status WriteFrame(uint8_t type, const std::string& payload, const pb::IndexEntry* entry);
  // A bucket record's frame, reported in *written when given.
  Status WriteBucketFrame(const pb::BucketRecord& record, std::vector<WrittenFrame>* written);
  Status WriteRaw(const void* data, size_t n);
  // A frame's stored bytes at file offset `at` (where stdio is): their block-aligned middle with O_DIRECT when
  // they were placed in direct_'s buffer (`placed`), the rest through stdio.
  Status WriteStored(const char* data, size_t n, uint64_t at, bool placed);
  Status Fail(Status s);          // makes `s` sticky
  void CutBack(uint64_t offset);  // after a failed write: drop stdio's buffer, cut a regular file at `offset`

  std::string path_;
  std::FILE* file_ = nullptr;
  WriterOptions options_;
  uint64_t offset_ = 0;
  uint64_t raw_bytes_ = 0;
  uint64_t direct_bytes_ = 0;
  pb::Index index_;
  bool closed_ = false;
  pb::RunInfo run_;
  Status error_;              // first I/O error; sticky
  Status close_status_;       // what Close() returned
  std::string compressed_;    // reused compression buffer
  DirectWrites direct_;       // where large frames are compressed to and written from when enabled
  void* zstd_ctx_ = nullptr;  // ZSTD_CCtx*, reused across frames
};

}  // namespace gradtrace
