#include "recorder.h"

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "device_slice.h"
#include "host_slice.h"
#include "name_pattern.h"
#include "trace_writer.h"
#include "validate.h"

namespace gradtrace::capture {
// The writer queue's types, named in this namespace (not an anonymous one): Recorder::Impl, a type with
// linkage, holds them.
namespace recorder_queue {

// One slice as the training thread hands it over: in full mode a host copy of
// the elements, encoded later; in sketch and stats mode already encoded (the
// payload is small and computing it costs less than copying the gradient).
struct SliceCopy {
  int32_t param_id = 0;
  int64_t offset = 0;
  int64_t count = 0;
  pb::DType dtype = pb::FP32;
  std::unique_ptr<uint8_t[]> bytes;  // full mode
  size_t nbytes = 0;
  std::optional<pb::Slice> encoded;  // sketch and stats mode
};

// One queued unit of work. Jobs carry a sequence number so that frames reach
// the file in the order the training thread recorded them, whatever thread
// encoded them.
struct Job {
  uint64_t seq = 0;
  std::optional<pb::StepInfo> step;
  BucketMeta meta;
  std::vector<SliceCopy> slices;
  int64_t bytes = 0;
};

// A bucket's values last written in full, and their frames: what its later phases are compared with.
struct KeptValues {
  std::vector<SliceCopy> slices;
  std::vector<WrittenFrame> frames;
  int64_t bytes = 0;
};
using BucketKey = std::tuple<int64_t, int32_t, int32_t>;  // step, micro step, bucket id

// The same slices, element for element and byte for byte.
bool SameValues(const std::vector<SliceCopy>& a, const std::vector<SliceCopy>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const SliceCopy& x = a[i];
    const SliceCopy& y = b[i];
    if (x.param_id != y.param_id || x.offset != y.offset || x.count != y.count || x.dtype != y.dtype ||
        x.nbytes != y.nbytes || !x.bytes || !y.bytes || std::memcmp(x.bytes.get(), y.bytes.get(), x.nbytes) != 0) {
      return false;
    }
  }
  return true;
}

}  // namespace recorder_queue
using recorder_queue::BucketKey;
using recorder_queue::Job;
using recorder_queue::KeptValues;
using recorder_queue::SliceCopy;

namespace {

struct TorchPair {
  pb::DType dtype;
  at::ScalarType type;
};
constexpr TorchPair kTorchDTypes[] = {
    {pb::FP32, at::kFloat}, {pb::FP16, at::kHalf}, {pb::BF16, at::kBFloat16}, {pb::FP64, at::kDouble}};

Expected<pb::DType> DTypeOf(const at::Tensor& t) {
  if (auto dtype = ProtoDType(t.scalar_type())) return *dtype;
  return Status::InvalidArgument(std::string("unsupported gradient dtype ") + c10::toString(t.scalar_type()));
}

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// CPU time of the calling thread: what a writer thread takes from training,
// unlike its wall time, which also counts waiting for a core.
double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

std::optional<at::ScalarType> TorchScalarType(pb::DType dtype) {
  for (const TorchPair& t : kTorchDTypes) {
    if (t.dtype == dtype) return t.type;
  }
  return std::nullopt;
}

std::optional<pb::DType> ProtoDType(at::ScalarType type) {
  for (const TorchPair& t : kTorchDTypes) {
    if (t.type == type) return t.dtype;
  }
  return std::nullopt;
}

struct Recorder::Impl {
  RecorderOptions options;
  pb::RunInfo run;
  std::vector<bool> wanted_params;
  std::vector<std::optional<std::vector<int64_t>>> sketch_positions;  // per parameter, filled on first use
  std::unique_ptr<TraceWriter> writer;

  std::mutex mu;
  std::condition_variable queue_cv;  // producer -> writer threads: work or stop
  std::condition_variable space_cv;  // writer threads -> producer: queue has room
  std::condition_variable order_cv;  // writer threads: whose turn it is to write
  std::deque<Job> queue;
  // Full mode: host buffers of written slices, reused by later copies of the
  // same size (every step has the same slices), so the copy on the training
  // thread does not page-fault fresh memory. Bounded by max_queue_bytes.
  std::multimap<size_t, std::unique_ptr<uint8_t[]>> free_buffers;
  int64_t free_bytes = 0;
  int64_t queued_bytes = 0;
  uint64_t next_seq = 0;    // next sequence number handed out
  uint64_t next_write = 0;  // next sequence number allowed to write
  bool stopping = false;
  bool enabled = true;
  bool closed = false;
  Status error;  // first write error (kAbort: surfaced to the producer)
  Stats stats;
  std::vector<std::thread> threads;
  // values_by_reference: what each bucket's later phases are compared with, oldest first out beyond
  // max_queue_bytes. Touched only by the thread whose turn it is to write (next_write), one at a time.
  std::map<BucketKey, KeptValues> kept;
  std::deque<BucketKey> kept_order;
  int64_t kept_bytes = 0;

  void Fail(const Status& st) {  // mu held
    if (!error.ok()) return;
    error = st;
    if (options.on_error == OnCaptureError::kDisable) {
      // One warning per rank, whatever fails after it (later frames, the index at Close).
      const std::string kept = writer ? options.path + " keeps the frames written before: a truncated trace"
                                      : "no trace is written for this rank";
      std::fprintf(stderr,
                   "gradtrace: WARNING: rank %lld: capture disabled after a write error: %s; training continues "
                   "without capture (%s)\n",
                   static_cast<long long>(run.rank()), st.message().c_str(), kept.c_str());
      std::fflush(stderr);
      enabled = false;
    }
  }

  void Encode(Job& job, pb::BucketRecord* rec, bool with_slices = true) const {
    rec->set_step(job.meta.step);
    rec->set_micro_step(job.meta.micro_step);
    rec->set_bucket_id(job.meta.bucket_id);
    rec->set_phase(job.meta.phase);
    rec->set_group(job.meta.group);
    rec->set_bucket_numel(job.meta.bucket_numel);
    rec->set_partition_offset(job.meta.partition_offset);
    rec->set_partition_count(job.meta.partition_count);
    rec->set_divisor(job.meta.divisor);
    if (!with_slices) return;
    for (SliceCopy& s : job.slices) {
      if (s.encoded) {
        *rec->add_slices() = std::move(*s.encoded);
      } else {
        *rec->add_slices() = MakeSlice(run.params(s.param_id), s.offset, s.count, s.dtype, s.bytes.get(), options.mode);
      }
    }
  }

  // The parameter's SketchPositions, computed once (training thread only).
  const std::vector<int64_t>& Positions(int32_t param_id) {
    std::optional<std::vector<int64_t>>& p = sketch_positions[param_id];
    if (!p) {
      const pb::ParamInfo& info = run.params(param_id);
      int64_t numel = info.numel();  // as MakeSlice: from the shape when unset
      if (numel == 0) {
        numel = 1;
        for (int64_t d : info.shape()) numel *= d;
      }
      p = SketchPositions(info.name(), numel, options.mode.k);
    }
    return *p;
  }

  void WriterLoop() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu);
        queue_cv.wait(lock, [&] { return stopping || !queue.empty(); });
        if (queue.empty()) return;
        job = std::move(queue.front());
        queue.pop_front();
      }
      // Compared with the bucket's values kept from an earlier phase (at its turn, when those are written) and
      // kept itself: full mode with references.
      const bool compared = !job.step && options.values_by_reference && options.mode.kind == CaptureMode::Kind::kFull;
      // Encoding (byte-shuffle in full mode) runs unlocked and in parallel; a record that may be written as a
      // reference only at its turn, and only if it is not.
      const bool maybe_reference = compared && job.meta.phase != pb::PRE_REDUCE;
      const double t0 = ThreadCpuSeconds();
      pb::BucketRecord rec;
      if (!job.step && !maybe_reference) Encode(job, &rec);
      double encode_seconds = ThreadCpuSeconds() - t0;
      std::unique_lock<std::mutex> lock(mu);
      if (!compared) {
        for (SliceCopy& c : job.slices) Recycle(std::move(c));
      }
      order_cv.wait(lock, [&] { return next_write == job.seq; });
      // Our turn: no other thread touches the writer until next_write moves,
      // so compress and write unlocked; the producer must not wait on `mu`
      // for the length of a zstd call.
      const bool write = enabled && error.ok();
      lock.unlock();
      const double t2 = ThreadCpuSeconds();
      Status st;
      bool by_reference = false;
      if (write && job.step) {
        st = writer->WriteStep(*job.step);
      } else if (write && compared) {
        st = WriteComparing(job, maybe_reference, &rec, &by_reference, &encode_seconds);
      } else if (write) {
        st = writer->WriteBucket(rec);
      }
      const double t3 = ThreadCpuSeconds();
      lock.lock();
      if (compared) {  // what WriteComparing did not keep
        for (SliceCopy& c : job.slices) Recycle(std::move(c));
      }
      if (write) {
        if (st.ok()) {
          ++stats.frames;
          if (by_reference) ++stats.reference_records;
        } else {
          Fail(st);
        }
      }
      stats.encode_cpu_seconds += encode_seconds;
      stats.write_cpu_seconds += t3 - t2 - (maybe_reference ? encode_seconds : 0);
      ++next_write;
      queued_bytes -= job.bytes;
      order_cv.notify_all();
      space_cv.notify_all();
    }
  }

  // A bucket job's record at its turn: as a reference to the frames of the bucket's values kept from an earlier
  // phase when its own are byte for byte the same, else in full (encoded here when `maybe_reference` left it to
  // this turn), its values then kept for the bucket's later phases. Copies it keeps leave job.slices empty.
  Status WriteComparing(Job& job, bool maybe_reference, pb::BucketRecord* rec, bool* by_reference,
                        double* encode_seconds) {
    const BucketKey key{job.meta.step, job.meta.micro_step, job.meta.bucket_id};
    // Kept values of earlier steps can match nothing later (steps only grow).
    while (!kept_order.empty() && std::get<0>(kept_order.front()) < job.meta.step) Forget(kept_order.front());
    auto it = kept.find(key);
    if (maybe_reference && it != kept.end() && SameValues(it->second.slices, job.slices)) {
      *by_reference = true;
      pb::BucketRecord meta;
      Encode(job, &meta, /*with_slices=*/false);
      const Status st = writer->WriteBucketValuesOf(meta, it->second.frames);
      if (job.meta.phase == pb::FINAL) Forget(key);  // no later phase
      return st;
    }
    if (maybe_reference) {
      const double t = ThreadCpuSeconds();
      Encode(job, rec);
      *encode_seconds += ThreadCpuSeconds() - t;
    }
    std::vector<WrittenFrame> frames;
    const Status st = writer->WriteBucket(*rec, &frames);
    if (it != kept.end()) Forget(key);
    const bool referable =
        std::all_of(frames.begin(), frames.end(), [](const WrittenFrame& f) { return f.referable(); });
    if (st.ok() && job.meta.phase != pb::FINAL && referable && job.bytes <= options.max_queue_bytes) {
      while (!kept_order.empty() && kept_bytes + job.bytes > options.max_queue_bytes) Forget(kept_order.front());
      KeptValues& k = kept[key];
      k.slices = std::move(job.slices);
      job.slices.clear();
      k.frames = std::move(frames);
      k.bytes = job.bytes;
      kept_bytes += k.bytes;
      kept_order.push_back(key);
    }
    return st;
  }

  void Forget(BucketKey key) {  // the writer's turn
    auto it = kept.find(key);
    if (it == kept.end()) return;
    kept_bytes -= it->second.bytes;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (SliceCopy& c : it->second.slices) Recycle(std::move(c));
    }
    kept.erase(it);
    kept_order.erase(std::find(kept_order.begin(), kept_order.end(), key));
  }

  void Recycle(SliceCopy&& c) {  // mu held
    if (!c.bytes || free_bytes + static_cast<int64_t>(c.nbytes) > options.max_queue_bytes) return;
    free_bytes += static_cast<int64_t>(c.nbytes);
    free_buffers.emplace(c.nbytes, std::move(c.bytes));
  }

  std::unique_ptr<uint8_t[]> Buffer(size_t n) {
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = free_buffers.find(n);
      if (it != free_buffers.end()) {
        std::unique_ptr<uint8_t[]> b = std::move(it->second);
        free_buffers.erase(it);
        free_bytes -= static_cast<int64_t>(n);
        return b;
      }
    }
    return std::unique_ptr<uint8_t[]>(new uint8_t[n]);  // uninitialised: the copy fills it
  }

  Status Enqueue(Job job) {
    std::unique_lock<std::mutex> lock(mu);
    if (!error.ok() && options.on_error == OnCaptureError::kAbort) return error;
    if (!enabled) return Status::Ok();
    // Back-pressure: wait for room, but always admit one job into an empty queue
    // so a single job larger than the limit cannot deadlock.
    auto t0 = std::chrono::steady_clock::now();
    space_cv.wait(lock, [&] { return queued_bytes == 0 || queued_bytes + job.bytes <= options.max_queue_bytes; });
    stats.producer_wait_seconds += Seconds(t0, std::chrono::steady_clock::now());
    job.seq = next_seq++;
    queued_bytes += job.bytes;
    queue.push_back(std::move(job));
    queue_cv.notify_one();
    return Status::Ok();
  }
};

Expected<std::unique_ptr<Recorder>> Recorder::Open(const RecorderOptions& options, pb::RunInfo run) {
  // The codec's own check, up front: a malformed RunInfo is the caller's bug,
  // refused even under kDisable (which would otherwise swallow the writer's refusal).
  if (Status st = ValidateRunInfo(run); !st.ok()) return Status::InvalidArgument("RunInfo: " + st.message());
  std::unique_ptr<Recorder> rec(new Recorder());
  rec->impl_ = std::make_unique<Impl>();
  Impl& im = *rec->impl_;
  im.options = options;
  im.run = std::move(run);
  std::optional<NamePattern> wanted;
  if (!options.param_regex.empty()) {
    auto compiled = NamePattern::Compile(options.param_regex);
    if (!compiled.ok()) {
      return Status::InvalidArgument("bad parameter regex '" + options.param_regex +
                                     "': " + compiled.status().message());
    }
    wanted = std::move(compiled).value();
  }
  for (const pb::ParamInfo& p : im.run.params()) im.wanted_params.push_back(!wanted || wanted->Search(p.name()));
  im.sketch_positions.resize(im.run.params_size());
  WriterOptions wopts;
  wopts.zstd_level = options.zstd_level;
  wopts.overwrite = options.overwrite;
  wopts.direct_io = options.direct_io;
  // A trace already there (a finished run without overwrite, or a live writer's) is the caller's choice to
  // make, not a write error: refused under kDisable too.
  struct stat before;
  const bool existed = ::lstat(options.path.c_str(), &before) == 0 && S_ISREG(before.st_mode);
  auto writer = TraceWriter::Open(options.path, im.run, wopts);
  if (!writer.ok()) {
    const bool refused = existed && (!options.overwrite || LockedByWriter(options.path));
    if (options.on_error == OnCaptureError::kAbort || refused) return writer.status();
    im.Fail(writer.status());
    return rec;
  }
  im.writer = std::move(writer).value();
  for (int i = 0; i < std::max(1, options.writer_threads); ++i) {
    im.threads.emplace_back([&im] { im.WriterLoop(); });
  }
  return rec;
}

Recorder::~Recorder() {
  if (impl_) Close();
}

bool Recorder::WantsStep(int64_t step) const { return !impl_->options.steps || impl_->options.steps->count(step) > 0; }

bool Recorder::WantsParam(int32_t param_id) const {
  return param_id >= 0 && param_id < static_cast<int32_t>(impl_->wanted_params.size()) &&
         impl_->wanted_params[param_id];
}

bool Recorder::enabled() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->enabled;
}

Status Recorder::RecordStep(const pb::StepInfo& step) {
  if (!WantsStep(step.step())) return Status::Ok();
  Job job;
  job.step = step;
  return impl_->Enqueue(std::move(job));
}

Status Recorder::RecordBucket(const BucketMeta& meta, const std::vector<SliceRef>& slices) {
  if (!WantsStep(meta.step)) return Status::Ok();
  const auto t0 = std::chrono::steady_clock::now();
  Job job;
  job.meta = meta;
  for (const SliceRef& ref : slices) {
    if (!WantsParam(ref.param_id)) continue;
    auto dtype = DTypeOf(ref.values);
    if (!dtype.ok()) return dtype.status();
    const pb::ParamInfo& p = impl_->run.params(ref.param_id);
    const int64_t count = ref.values.numel();
    if (ref.offset < 0 || ref.offset + count > p.numel()) {
      return Status::InvalidArgument("slice [" + std::to_string(ref.offset) + ", " +
                                     std::to_string(ref.offset + count) + ") is outside parameter " + p.name() +
                                     " of " + std::to_string(p.numel()) + " elements");
    }
    SliceCopy copy;
    copy.param_id = ref.param_id;
    copy.offset = ref.offset;
    copy.count = count;
    copy.dtype = *dtype;
    const at::Tensor flat = ref.values.detach().reshape({-1});
    const CaptureMode& mode = impl_->options.mode;
    if (mode.kind == CaptureMode::Kind::kFull) {
      // Full mode's only work here: one copy to host memory.
      const at::Tensor host = flat.to(at::kCPU).contiguous();
      copy.nbytes = host.nbytes();
      copy.bytes = impl_->Buffer(copy.nbytes);
      std::memcpy(copy.bytes.get(), host.data_ptr(), copy.nbytes);
      job.bytes += static_cast<int64_t>(copy.nbytes);
    } else {
      const std::vector<int64_t>& positions = impl_->Positions(ref.param_id);
      if (!flat.is_cpu() || impl_->options.device_path_on_cpu) {
        copy.encoded = DeviceSlice(p, ref.offset, flat, *dtype, mode, positions);
      } else {
        copy.encoded = HostSlice(p, ref.offset, flat, *dtype, mode, positions);
      }
      job.bytes += static_cast<int64_t>(copy.encoded->ByteSizeLong());
    }
    job.slices.push_back(std::move(copy));
  }
  Status st = job.slices.empty() ? Status::Ok() : impl_->Enqueue(std::move(job));
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->stats.record_seconds += Seconds(t0, std::chrono::steady_clock::now());
  return st;
}

Status Recorder::Close() {
  Impl& im = *impl_;
  {
    std::lock_guard<std::mutex> lock(im.mu);
    if (im.closed) return im.options.on_error == OnCaptureError::kAbort ? im.error : Status::Ok();
    im.closed = true;
    im.stopping = true;
  }
  im.queue_cv.notify_all();
  for (std::thread& t : im.threads) t.join();
  im.threads.clear();
  if (im.writer) {
    Status st = im.writer->Close();
    std::lock_guard<std::mutex> lock(im.mu);
    if (!st.ok()) im.Fail(st);
    im.stats.raw_bytes = im.writer->raw_bytes();
    im.stats.file_bytes = im.writer->bytes_written();
  }
  return im.options.on_error == OnCaptureError::kAbort ? im.error : Status::Ok();
}

Recorder::Stats Recorder::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

}  // namespace gradtrace::capture
