// Recorder: what gradtrace-train (and any LibTorch program) calls to capture
// gradients. In full mode the training thread only copies tensors (device to
// host on GPU) into a bounded queue; byte-shuffle, zstd and file I/O run on
// writer threads. In sketch and stats mode the training thread computes the
// small payload where the tensor lives (K gathers, or one pass at memory
// bandwidth; on the GPU with torch ops, device_slice.h), which costs less than
// the copy it replaces. A full queue blocks the producer (back-pressure), so
// memory stays bounded by RecorderOptions::max_queue_bytes.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gradtrace.pb.h"
#include "slice_codec.h"
#include "status.h"

namespace gradtrace::capture {

// What a write error (a full disk, EFBIG, permission, I/O) does. kDisable (the
// default): one warning on stderr naming the rank, the file and the error,
// then capture stops and training goes on; the file keeps every complete frame
// written before (it reads as truncated). kAbort: Record*/Close return it.
// Either way an existing trace at `path` (without `overwrite`) or one another
// writer holds is refused at Open: a choice the caller has to make.
enum class OnCaptureError { kAbort, kDisable };

struct RecorderOptions {
  std::string path;                        // this rank's trace file, e.g. DIR/rank-00003.gtrace
  CaptureMode mode;                        // full, sketch:K, stats
  std::optional<std::set<int64_t>> steps;  // unset: every step
  std::string param_regex;                 // empty: every parameter (a match anywhere in the name; RE2 syntax)
  int writer_threads = 1;
  int64_t max_queue_bytes = 256ll << 20;
  OnCaptureError on_error = OnCaptureError::kDisable;
  bool overwrite = false;  // replace a finished trace at `path` (WriterOptions::overwrite); never a live one
  int zstd_level = 1;      // docs/dev/performance.md, "Capture": level 3 costs more CPU for ~1% smaller files
  bool direct_io = true;   // WriterOptions::direct_io: large frames past the page cache
  // Full mode: a POST_REDUCE or FINAL record whose slices are byte for byte
  // those last written in full for the same step, micro step and bucket is
  // written as a reference to their frames (format 1.6, FORMAT.md 4.3), so it
  // costs a comparison instead of a compression and its bytes (on one rank,
  // POST and FINAL hold PRE's values). The copies kept to compare with count
  // against max_queue_bytes once more. false: every record holds its values,
  // for readers older than 1.6.
  bool values_by_reference = true;
  bool device_path_on_cpu = false;  // tests: take the device path (device_slice.h) for CPU tensors too
};

// One contiguous range of one parameter's flattened gradient.
struct SliceRef {
  int32_t param_id = 0;
  int64_t offset = 0;  // element offset within the parameter
  at::Tensor values;   // 1-D, `count` elements, any device; copied before Record* returns
};

struct BucketMeta {
  int64_t step = 0;
  int32_t micro_step = 0;
  int32_t bucket_id = 0;
  pb::Phase phase = pb::PRE_REDUCE;
  std::string group;  // process-group name ("" for FINAL)
  int64_t bucket_numel = 0;
  int64_t partition_offset = 0;  // ZeRO-1/2 partition owned by this rank
  int64_t partition_count = 0;
  double divisor = 0;  // divisor applied by the scaling policy
};

class Recorder {
 public:
  // Opens the trace file and writes RunInfo. `run` must pass the codec's
  // ValidateRunInfo (ids 0..n-1, numel == product(shape)); the writer fills an
  // empty fingerprint.
  static Expected<std::unique_ptr<Recorder>> Open(const RecorderOptions& options, pb::RunInfo run);
  ~Recorder();  // Close() if not yet closed

  bool WantsStep(int64_t step) const;
  bool WantsParam(int32_t param_id) const;
  bool enabled() const;  // false after a write error with kDisable

  // Both return a write error only with OnCaptureError::kAbort; with kDisable
  // the first error is reported once to stderr and capture stops (these then
  // return Ok and record nothing; Close too).
  Status RecordStep(const pb::StepInfo& step);
  // Slices of unwanted parameters are dropped; nothing is written when none remain.
  Status RecordBucket(const BucketMeta& meta, const std::vector<SliceRef>& slices);

  // Drains the queue, writes the index and closes the file.
  Status Close();

  struct Stats {
    uint64_t frames = 0, raw_bytes = 0, file_bytes = 0;
    uint64_t reference_records = 0;    // records written as references (values_by_reference)
    double record_seconds = 0;         // training thread inside RecordBucket (copy or encode, and waits)
    double producer_wait_seconds = 0;  // of which blocked on a full queue
    double encode_cpu_seconds = 0;     // writer threads' CPU: building records (byte-shuffle)
    double write_cpu_seconds = 0;      // writer threads' CPU: chunk, serialize, zstd, CRC, write, flush
  };
  Stats stats() const;

 private:
  Recorder() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The torch type of each trace dtype (proto/dtype.h) and back: capture's one torch <-> proto map.
std::optional<at::ScalarType> TorchScalarType(pb::DType dtype);
std::optional<pb::DType> ProtoDType(at::ScalarType type);

}  // namespace gradtrace::capture
