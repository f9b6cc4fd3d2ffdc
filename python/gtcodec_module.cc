// _gtcodec: the Python binding of the one C++ trace codec (proto/). The
// pure-Python package gradtrace/ wraps it; nothing here knows the wire format,
// it only converts between protobuf messages and Python objects.
//
// Conventions at this boundary:
// - A Status from reading or writing a file becomes gradtrace.TraceError (its
//   one-line message, plus a `code` attribute); InvalidArgument becomes
//   ValueError, since it means the caller passed something wrong.
// - RunInfo crosses as proto JSON (proto field names, enums by name, defaults
//   printed) so the package needs no Python protobuf. StepInfo and
//   BucketRecord are converted field by field here, with slice payloads as
//   numpy arrays.
// - File I/O, compression and encoding run with the GIL released.
#include <google/protobuf/util/json_util.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <bit>
#include <cctype>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "chunking.h"
#include "deepspeed_releases.h"
#include "dtype.h"
#include "format.h"
#include "gradtrace.pb.h"
#include "init_sketch.h"
#include "judge_binding.h"
#include "loss_recipes.h"
#include "rank_file.h"
#include "reduction_path.h"
#include "run_info_json.h"
#include "scaling_policy.h"
#include "slice_codec.h"
#include "status.h"
#include "trace_reader.h"
#include "trace_writer.h"

namespace py = pybind11;

namespace gradtrace {
namespace {

static_assert(std::endian::native == std::endian::little,
              "numpy arrays are filled with the file's little-endian bytes");

// Carries a non-ok Status out of the binding; translated to TraceError.
class CodecError : public std::exception {
 public:
  explicit CodecError(Status status) : status_(std::move(status)) {}
  const char* what() const noexcept override { return status_.message().c_str(); }
  const Status& status() const { return status_; }

 private:
  Status status_;
};

PyObject* g_trace_error = nullptr;  // created once at import, owned by the module

const char* CodeName(Status::Code code) {
  switch (code) {
    case Status::Code::kOk:
      return "ok";
    case Status::Code::kIoError:
      return "io_error";
    case Status::Code::kCorruption:
      return "corruption";
    case Status::Code::kTruncated:
      return "truncated";
    case Status::Code::kLimitExceeded:
      return "limit_exceeded";
    case Status::Code::kInvalidArgument:
      return "invalid_argument";
    case Status::Code::kMismatch:
      return "mismatch";
  }
  return "unknown";
}

// For calls whose arguments come from the caller: InvalidArgument means the
// caller passed something wrong (ValueError); anything else is the file's
// problem (TraceError).
void ThrowIfError(const Status& status) {
  if (status.ok()) return;
  if (status.code() == Status::Code::kInvalidArgument) throw py::value_error(status.message());
  throw CodecError(status);
}

// For statuses about a file being read: even InvalidArgument (e.g. a newer
// major version) is about the file, not the caller.
void ThrowIfFileError(const Status& status) {
  if (!status.ok()) throw CodecError(status);
}

// --- RunInfo <-> JSON -------------------------------------------------------

std::string RunInfoToJson(const pb::RunInfo& run) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string out;
  const auto st = google::protobuf::util::MessageToJsonString(run, &out, options);
  // Printing a valid message cannot fail; if it does, it is our bug.
  if (!st.ok()) throw std::runtime_error("RunInfo to JSON failed: " + std::string(st.message()));
  return out;
}

// Dotted paths of the 64-bit integer fields reachable from `desc` (proto JSON
// prints those as strings; the package turns them back into ints). Repeated
// message fields are descended into; map fields are skipped (RunInfo's maps
// are string -> string).
void CollectInt64Paths(const google::protobuf::Descriptor* desc, const std::string& prefix, int depth,
                       std::vector<std::string>* out) {
  using FD = google::protobuf::FieldDescriptor;
  if (depth > 8) return;  // the schema is not recursive; this only bounds a future mistake
  for (int i = 0; i < desc->field_count(); ++i) {
    const FD* f = desc->field(i);
    const std::string path = prefix.empty() ? f->name() : prefix + "." + f->name();
    if (f->is_map()) continue;
    switch (f->cpp_type()) {
      case FD::CPPTYPE_INT64:
      case FD::CPPTYPE_UINT64:
        out->push_back(path);
        break;
      case FD::CPPTYPE_MESSAGE:
        CollectInt64Paths(f->message_type(), path, depth + 1, out);
        break;
      default:
        break;
    }
  }
}

// --- Frames -> Python ---------------------------------------------------------

std::string PhaseName(pb::Phase phase) { return pb::Phase_Name(phase); }

py::str DTypeKey(pb::DType dtype) { return py::str(DTypeName(dtype)); }

// The numpy type string of `dtype`'s values array: a little-endian IEEE binary16/32/64 is
// numpy's float of that size; any other format (bf16) has no numpy type, so its raw bits.
std::string NumpyTypeString(const DTypeInfo& row) {
  const bool ieee = (row.size == 2 && row.exponent_bits == 5) || (row.size == 4 && row.exponent_bits == 8) ||
                    (row.size == 8 && row.exponent_bits == 11);
  return (ieee ? "<f" : "<u") + std::to_string(row.size);
}

py::dtype NumpyDType(pb::DType dtype) {
  const DTypeInfo* row = FindDType(dtype);
  if (row == nullptr) throw std::runtime_error("unvalidated dtype reached the binding");
  return py::dtype(NumpyTypeString(*row));
}

template <typename T>
py::array_t<T> ToArray(const google::protobuf::RepeatedField<T>& values) {
  py::array_t<T> out(static_cast<py::ssize_t>(values.size()));
  if (values.size() > 0) std::memcpy(out.mutable_data(), values.data(), sizeof(T) * values.size());
  return out;
}

py::dict SliceToDict(const pb::Slice& s, const std::string& where) {
  py::dict d;
  d["param_id"] = s.param_id();
  d["offset"] = s.offset();
  d["count"] = s.count();
  d["dtype"] = DTypeKey(s.dtype());
  switch (s.payload_case()) {
    case pb::Slice::kFull: {
      Expected<std::string> bytes = DecodeFullBytes(s);
      if (!bytes.ok()) throw CodecError(Status::Corruption(where + ": " + bytes.status().message()));
      py::array values(NumpyDType(s.dtype()), py::array::ShapeContainer{static_cast<py::ssize_t>(s.count())});
      if (!bytes->empty()) std::memcpy(values.mutable_data(), bytes->data(), bytes->size());
      d["mode"] = "full";
      d["values"] = std::move(values);
      break;
    }
    case pb::Slice::kSketch:
      d["mode"] = "sketch";
      d["k"] = s.sketch().k();
      d["positions"] = ToArray(s.sketch().positions());
      d["values"] = ToArray(s.sketch().values());
      break;
    case pb::Slice::kStats: {
      py::dict st;
      st["count"] = s.stats().count();
      st["sum"] = s.stats().sum();
      st["sum_sq"] = s.stats().sum_sq();
      st["abs_max"] = s.stats().abs_max();
      st["nonfinite"] = s.stats().nonfinite();
      d["mode"] = "stats";
      d["stats"] = std::move(st);
      break;
    }
    case pb::Slice::PAYLOAD_NOT_SET:
      // The reader validates records; an empty payload never gets here.
      throw CodecError(Status::Corruption(where + ": slice without payload"));
  }
  return d;
}

py::dict StepToDict(const pb::StepInfo& s, uint64_t offset) {
  py::dict d;
  d["type"] = "step";
  d["offset"] = offset;
  d["step"] = s.step();
  d["micro_step"] = s.micro_step();
  d["loss"] = s.loss();
  d["valid_tokens"] = s.valid_tokens();
  d["lr"] = s.lr();
  d["reported_grad_norm"] = s.has_reported_grad_norm() ? py::cast(s.reported_grad_norm()) : py::none();
  d["optimizer_step"] = s.optimizer_step();
  d["input_count"] = s.input_count();  // since 1.4 (FORMAT.md 4.1); 0 = not recorded
  d["input_sum"] = s.input_sum();
  d["input_sumsq"] = s.input_sumsq();
  return d;
}

py::dict BucketToDict(const pb::BucketRecord& b, uint64_t offset, const std::string& path) {
  py::dict d;
  d["type"] = "bucket";
  d["offset"] = offset;
  d["step"] = b.step();
  d["micro_step"] = b.micro_step();
  d["bucket_id"] = b.bucket_id();
  d["phase"] = PhaseName(b.phase());
  d["group"] = b.group();
  d["bucket_numel"] = b.bucket_numel();
  d["partition_offset"] = b.partition_offset();
  d["partition_count"] = b.partition_count();
  d["divisor"] = b.divisor();
  d["chunk"] = b.chunk();
  d["chunk_count"] = b.chunk_count();
  d["last_slice_continues"] = b.last_slice_continues();
  d["values_from"] = b.values_from();  // format 1.6: 0, or the frame the values were read from
  const std::string where = path + ": frame at offset " + std::to_string(offset);
  py::list slices;
  for (const pb::Slice& s : b.slices()) slices.append(SliceToDict(s, where));
  d["slices"] = std::move(slices);
  return d;
}

py::object FrameToObject(const Frame& f, const std::string& path) {
  if (f.step) return StepToDict(*f.step, f.offset);
  if (f.bucket) return BucketToDict(*f.bucket, f.offset, path);
  return py::none();  // a frame type from a newer minor version
}

// --- Reader -----------------------------------------------------------------

class PyReader {
 public:
  PyReader(const std::string& path, bool use_index) {
    ReadOptions options;
    options.use_index = use_index;
    Expected<std::unique_ptr<TraceReader>> r = [&] {
      py::gil_scoped_release release;
      return TraceReader::Open(path, options);
    }();
    ThrowIfFileError(r.status());
    reader_ = std::move(r.value());
  }

  std::string run_info_json() const { return RunInfoToJson(reader_->run_info()); }

  // The next StepInfo/BucketRecord as a dict, None for a frame of unknown
  // type; raises StopIteration at the end (clean, truncated or corrupt: the
  // caller reads the status to tell which). With `merge`, the chunks of a
  // record the writer split (consecutive frames) come back as one record; a
  // record cut short by the end of a truncated file is dropped, like any
  // frame in flight, and the status says Truncated.
  py::object next(bool merge) {
    Frame frame;
    bool got;
    Status merge_status;
    std::optional<pb::BucketRecord> merged;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mu_);
      got = reader_->Next(&frame);
      if (got && merge && frame.bucket && frame.bucket->chunk_count() > 1) {
        merge_status = ReadChunks(&frame, &merged);
        got = merge_status.ok() && merged.has_value();
      }
    }
    if (!merge_status.ok()) throw CodecError(merge_status);
    if (!got) throw py::stop_iteration();
    if (merged) return BucketToDict(*merged, frame.offset, reader_->path());
    return FrameToObject(frame, reader_->path());
  }

  py::object frame_at(uint64_t offset) {
    Frame frame;
    Status st;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mu_);
      st = reader_->ReadAt(offset, &frame);
    }
    ThrowIfError(st);
    return FrameToObject(frame, reader_->path());
  }

  py::list index() const {
    py::list out;
    for (const pb::IndexEntry& e : reader_->index().entries()) {
      py::dict d;
      d["offset"] = e.offset();
      d["type"] = e.type() == static_cast<uint32_t>(format::FrameType::kStepInfo)       ? py::str("step")
                  : e.type() == static_cast<uint32_t>(format::FrameType::kBucketRecord) ? py::str("bucket")
                                                                                        : py::str("unknown");
      d["step"] = e.step();
      d["micro_step"] = e.micro_step();
      d["bucket_id"] = e.bucket_id();
      d["phase"] = PhaseName(e.phase());
      // Catalogue fields (format 1.1; zero/empty in a 1.0 file, see `catalogued`).
      d["param_ids"] = py::cast(std::vector<int32_t>(e.param_ids().begin(), e.param_ids().end()));
      d["group"] = e.group();
      d["raw_len"] = e.raw_len();
      d["bucket_numel"] = e.bucket_numel();
      d["partition_offset"] = e.partition_offset();
      d["partition_count"] = e.partition_count();
      d["divisor"] = e.divisor();
      out.append(std::move(d));
    }
    return out;
  }

  const TraceReader& reader() const { return *reader_; }

 private:
  // `first` is chunk 0 of a split record; reads the other chunks and merges.
  // Leaves *out empty when the frames end first (the reader's status says why).
  Status ReadChunks(Frame* first, std::optional<pb::BucketRecord>* out) {
    const std::string where = reader_->path() + ": record at offset " + std::to_string(first->offset) + ": ";
    const int32_t n = first->bucket->chunk_count();
    std::vector<pb::BucketRecord> chunks;
    chunks.push_back(std::move(*first->bucket));
    while (static_cast<int32_t>(chunks.size()) < n) {
      Frame f;
      if (!reader_->Next(&f)) return Status::Ok();
      if (!f.bucket) {
        return Status::Corruption(where + "chunk " + std::to_string(chunks.size()) + " of " + std::to_string(n) +
                                  " expected at offset " + std::to_string(f.offset) + ", found another frame type");
      }
      chunks.push_back(std::move(*f.bucket));
    }
    Expected<pb::BucketRecord> m = MergeChunks(std::move(chunks));
    if (!m.ok()) return Status::Corruption(where + m.status().message());
    *out = std::move(m.value());
    return Status::Ok();
  }

  std::unique_ptr<TraceReader> reader_;
  std::mutex mu_;  // Next/ReadAt run without the GIL; two Python threads must not interleave them
};

// --- Writer -----------------------------------------------------------------

template <typename T>
T DictGet(const py::dict& d, const char* key, T fallback) {
  if (!d.contains(key)) return fallback;
  return d[key].cast<T>();
}

pb::Phase ParsePhase(const py::handle& h) {
  if (py::isinstance<py::int_>(h)) {
    const int v = h.cast<int>();
    if (!pb::Phase_IsValid(v)) throw py::value_error("invalid phase " + std::to_string(v));
    return static_cast<pb::Phase>(v);
  }
  std::string name = h.cast<std::string>();
  for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  pb::Phase phase;
  if (!pb::Phase_Parse(name, &phase) || phase == pb::PHASE_UNSPECIFIED) {
    throw py::value_error("invalid phase '" + h.cast<std::string>() + "': expected PRE_REDUCE, POST_REDUCE or FINAL");
  }
  return phase;
}

class PyWriter {
 public:
  PyWriter(const std::string& path, const std::string& run_info_json, int zstd_level, bool write_index,
           bool overwrite) {
    pb::RunInfo run = RunInfoFromJson(run_info_json);
    if (run.model_fingerprint().empty()) run.set_model_fingerprint(ModelFingerprint(run));
    WriterOptions options;
    options.zstd_level = zstd_level;
    options.write_index = write_index;
    options.overwrite = overwrite;
    Expected<std::unique_ptr<TraceWriter>> w = [&] {
      py::gil_scoped_release release;
      return TraceWriter::Open(path, run, options);
    }();
    ThrowIfError(w.status());
    writer_ = std::move(w.value());
    run_ = std::move(run);
  }

  std::string run_info_json() const { return RunInfoToJson(run_); }

  void write_step(const py::dict& d) {
    pb::StepInfo step;
    step.set_step(DictGet<int64_t>(d, "step", 0));
    step.set_micro_step(DictGet<int32_t>(d, "micro_step", 0));
    step.set_loss(DictGet<double>(d, "loss", 0.0));
    step.set_valid_tokens(DictGet<int64_t>(d, "valid_tokens", 0));
    step.set_lr(DictGet<double>(d, "lr", 0.0));
    if (d.contains("reported_grad_norm") && !d["reported_grad_norm"].is_none())
      step.set_reported_grad_norm(d["reported_grad_norm"].cast<double>());
    step.set_optimizer_step(DictGet<bool>(d, "optimizer_step", false));
    step.set_input_count(DictGet<int64_t>(d, "input_count", 0));
    step.set_input_sum(DictGet<double>(d, "input_sum", 0.0));
    step.set_input_sumsq(DictGet<double>(d, "input_sumsq", 0.0));
    CheckOpen();
    Status st;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mu_);
      st = writer_->WriteStep(step);
    }
    ThrowIfError(st);
  }

  // `header`: the BucketRecord's scalar fields. `slices`: (param_id, offset,
  // dtype name, contiguous buffer, capture mode) tuples; the package builds
  // them from the user's dicts.
  void write_bucket(const py::dict& header, const py::list& slices) {
    pb::BucketRecord record = BucketHeader(header);
    // Every tuple is checked before the first slice is encoded: a bad one raises with nothing written.
    std::vector<PendingSlice> pending;
    pending.reserve(slices.size());
    for (size_t i = 0; i < slices.size(); ++i) pending.push_back(ParseSlice(i, slices[i]));
    CheckOpen();
    Status st;
    {
      // The buffers stay alive (and their views held) in `pending`.
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mu_);
      for (const PendingSlice& p : pending) {
        *record.add_slices() = MakeSlice(*p.param, p.offset, p.count, p.dtype, p.buf.ptr, p.mode);
      }
      st = writer_->WriteBucket(record);
    }
    ThrowIfError(st);
  }

  void close() {
    if (closed_) return;
    Status st;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mu_);
      st = writer_->Close();
    }
    closed_ = true;
    ThrowIfError(st);
  }

  const TraceWriter& writer() const { return *writer_; }

 private:
  void CheckOpen() const {
    if (closed_) throw py::value_error("write to a closed TraceWriter");
  }

  // One slice of write_bucket, checked against the run's parameter table; encoded later, without the GIL.
  struct PendingSlice {
    const pb::ParamInfo* param;
    int64_t offset;
    int64_t count;
    pb::DType dtype;
    py::buffer_info buf;
    CaptureMode mode;
  };

  // The BucketRecord's scalar fields from write_bucket's `header` dict.
  static pb::BucketRecord BucketHeader(const py::dict& header) {
    pb::BucketRecord record;
    record.set_step(DictGet<int64_t>(header, "step", 0));
    record.set_micro_step(DictGet<int32_t>(header, "micro_step", 0));
    record.set_bucket_id(DictGet<int32_t>(header, "bucket_id", 0));
    if (!header.contains("phase")) throw py::value_error("bucket record needs a phase");
    record.set_phase(ParsePhase(header["phase"]));
    record.set_group(DictGet<std::string>(header, "group", ""));
    record.set_bucket_numel(DictGet<int64_t>(header, "bucket_numel", 0));
    record.set_partition_offset(DictGet<int64_t>(header, "partition_offset", 0));
    record.set_partition_count(DictGet<int64_t>(header, "partition_count", 0));
    record.set_divisor(DictGet<double>(header, "divisor", 0.0));
    return record;
  }

  // Slice tuple `i` of write_bucket; ValueError naming it when it does not fit the parameter table.
  PendingSlice ParseSlice(size_t i, const py::handle& item) const {
    const auto t = item.cast<py::tuple>();
    if (t.size() != 5) throw py::value_error("slice tuple must have 5 items");
    const std::string at = "slice " + std::to_string(i);
    const auto param_id = t[0].cast<int64_t>();
    if (param_id < 0 || param_id >= run_.params_size()) {
      throw py::value_error(at + ": param_id " + std::to_string(param_id) + " out of range [0, " +
                            std::to_string(run_.params_size()) + ")");
    }
    const pb::ParamInfo& param = run_.params(static_cast<int>(param_id));
    const auto offset = t[1].cast<int64_t>();
    pb::DType dtype;
    const auto dtype_name = t[2].cast<std::string>();
    if (!ParseDType(dtype_name, &dtype)) {
      throw py::value_error(at + ": unknown dtype '" + dtype_name + "': expected " + DTypeNamesInWords());
    }
    py::buffer_info buf = t[3].cast<py::buffer>().request();
    if (static_cast<size_t>(buf.itemsize) != DTypeSize(dtype)) {
      throw py::value_error(at + ": buffer item size " + std::to_string(buf.itemsize) + " does not match dtype " +
                            dtype_name);
    }
    if (buf.ndim != 1 || (buf.size > 1 && buf.strides[0] != buf.itemsize)) {
      throw py::value_error(at + ": values must be a contiguous 1-D buffer");
    }
    const int64_t count = buf.size;
    if (offset < 0 || offset > param.numel() || count > param.numel() - offset) {
      throw py::value_error(at + ": elements [" + std::to_string(offset) + ", " + std::to_string(offset + count) +
                            ") outside parameter '" + param.name() + "' of " + std::to_string(param.numel()) +
                            " elements (expected offset + count <= numel)");
    }
    Expected<CaptureMode> mode = ParseCaptureMode(t[4].cast<std::string>());
    if (!mode.ok()) throw py::value_error(at + ": " + mode.status().message());
    return {&param, offset, count, dtype, std::move(buf), *mode};
  }

  std::unique_ptr<TraceWriter> writer_;
  pb::RunInfo run_;
  bool closed_ = false;
  std::mutex mu_;
};

// --- Module registration, one area each --------------------------------------

// gradtrace.TraceError, and the translator that raises it for a CodecError.
void RegisterTraceError(py::module_& m) {
  g_trace_error = PyErr_NewExceptionWithDoc(
      "gradtrace.TraceError",
      "A trace file could not be opened, read or written. str(e) is the codec's one-line message naming the "
      "file and offset; e.code is one of io_error, corruption, truncated, limit_exceeded, mismatch.",
      PyExc_Exception, nullptr);
  if (g_trace_error == nullptr) throw py::error_already_set();
  // add_object takes its own reference; ours keeps the type alive for the translator below.
  m.add_object("TraceError", py::handle(g_trace_error));

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const CodecError& e) {
      py::object exc = py::reinterpret_borrow<py::object>(g_trace_error)(e.status().message());
      exc.attr("code") = CodeName(e.status().code());
      PyErr_SetObject(g_trace_error, exc.ptr());
    }
  });
}

void RegisterReader(py::module_& m) {
  py::class_<PyReader>(m, "Reader")
      .def(py::init<const std::string&, bool>(), py::arg("path"), py::arg("use_index") = true)
      .def("run_info_json", &PyReader::run_info_json)
      .def("next", &PyReader::next, py::arg("merge_chunks") = true)
      .def("frame_at", &PyReader::frame_at, py::arg("offset"))
      .def("index", &PyReader::index)
      .def_property_readonly("path", [](const PyReader& r) { return r.reader().path(); })
      .def_property_readonly("file_size", [](const PyReader& r) { return r.reader().file_size(); })
      .def_property_readonly("has_index", [](const PyReader& r) { return r.reader().has_index(); })
      .def_property_readonly("catalogued", [](const PyReader& r) { return r.reader().catalogued(); })
      .def_property_readonly(
          "format_version",
          [](const PyReader& r) { return py::make_tuple(format::kMajorVersion, r.reader().minor_version()); })
      .def_property_readonly("status_code", [](const PyReader& r) { return CodeName(r.reader().status().code()); })
      .def_property_readonly("status_message", [](const PyReader& r) { return r.reader().status().message(); })
      .def_property_readonly("stop_offset", [](const PyReader& r) { return r.reader().stop_offset(); })
      .def_property_readonly("stored_bytes", [](const PyReader& r) { return r.reader().stored_bytes(); })
      .def_property_readonly("raw_bytes", [](const PyReader& r) { return r.reader().raw_bytes(); });
}

void RegisterWriter(py::module_& m) {
  py::class_<PyWriter>(m, "Writer")
      .def(py::init<const std::string&, const std::string&, int, bool, bool>(), py::arg("path"),
           py::arg("run_info_json"), py::arg("zstd_level") = WriterOptions{}.zstd_level, py::arg("write_index") = true,
           py::arg("overwrite") = false)
      .def("run_info_json", &PyWriter::run_info_json)
      .def("write_step", &PyWriter::write_step, py::arg("step"))
      .def("write_bucket", &PyWriter::write_bucket, py::arg("header"), py::arg("slices"))
      .def("close", &PyWriter::close)
      .def_property_readonly("path", [](const PyWriter& w) { return w.writer().path(); })
      .def_property_readonly("bytes_written", [](const PyWriter& w) { return w.writer().bytes_written(); })
      .def_property_readonly("raw_bytes", [](const PyWriter& w) { return w.writer().raw_bytes(); });
}

// The codec's rules outside the reader and writer: sketch positions, fingerprints, verification, capture
// modes, the JSON's int64 fields, and the format version.
void RegisterCodecFunctions(py::module_& m) {
  m.def(
      "sketch_positions",
      [](const std::string& name, int64_t numel, int64_t k) {
        if (numel < 0) throw py::value_error("numel must be >= 0");
        if (k < 1 || k > std::numeric_limits<int32_t>::max()) throw py::value_error("k must be in [1, 2^31)");
        std::vector<int64_t> pos = SketchPositions(name, numel, static_cast<int32_t>(k));
        py::array_t<int64_t> out(static_cast<py::ssize_t>(pos.size()));
        if (!pos.empty()) std::memcpy(out.mutable_data(), pos.data(), pos.size() * sizeof(int64_t));
        return out;
      },
      py::arg("name"), py::arg("numel"), py::arg("k"));
  m.def(
      "model_fingerprint", [](const std::string& json) { return ModelFingerprint(RunInfoFromJson(json)); },
      py::arg("run_info_json"));
  m.def(
      "verify",
      [](const std::string& path) {
        Status st;
        {
          py::gil_scoped_release release;
          st = VerifyFile(path);
        }
        ThrowIfFileError(st);
      },
      py::arg("path"));
  m.def(
      "parse_capture_mode",
      [](const std::string& text) {
        Expected<CaptureMode> mode = ParseCaptureMode(text);
        ThrowIfError(mode.status());
        return mode->ToString();
      },
      py::arg("text"));
  m.def("int64_paths", [] {
    std::vector<std::string> out;
    CollectInt64Paths(pb::RunInfo::descriptor(), "", 0, &out);
    return out;
  });
  // The elements whose initial values ParamInfo.init_sketch records (proto/init_sketch.h): one rule for every producer.
  m.def(
      "init_sketch_positions", [](int64_t numel) { return InitSketchPositions(numel); }, py::arg("numel"));
  m.attr("FORMAT_VERSION") = py::make_tuple(format::kMajorVersion, format::kMinorVersion);
}

const char* ScalingRuleName(semantics::ScalingRule r) {
  switch (r) {
    case semantics::ScalingRule::kSum:
      return "sum";
    case semantics::ScalingRule::kMean:
      return "mean";
    case semantics::ScalingRule::kDs4530:
      return "ds-4530";
    case semantics::ScalingRule::kDsPre4957:
      return "ds-pre-4957";
  }
  return "?";
}

// The one DeepSpeed release table (semantics/deepspeed_releases.h), a dict per release.
py::list DeepSpeedReleaseTable() {
  py::list out;
  for (const auto& r : semantics::DeepSpeedReleases()) {
    py::dict d;
    d["version"] = r.version;
    d["engine"] = ScalingRuleName(r.engine);
    d["zero"] = ScalingRuleName(r.zero);
    d["zero3_reduce_scatter"] = ScalingRuleName(r.zero3_reduce_scatter);
    d["zero3_allreduce"] = ScalingRuleName(r.zero3_allreduce);
    d["engine_cite"] = r.engine_cite;
    d["zero_cite"] = r.zero_cite;
    d["zero3_cite"] = r.zero3_cite;
    d["engine_unmodelled"] = r.engine_unmodelled;
    d["has_pr4530"] = semantics::HasPr4530(r.version);
    d["has_pr4957"] = semantics::HasPr4957(r.version);
    out.append(d);
  }
  return out;
}

// The divisor `policy` plans for one bucket; ValueError names the argument that is wrong.
double BucketDivisor(const std::string& policy, const std::string& path, int group_size, int sp, bool has_moe) {
  auto p = semantics::ResolvePolicy(policy);
  if (!p.ok()) throw py::value_error(p.status().message());
  semantics::BucketContext b;
  const auto parsed = semantics::ParseReductionPath(path);
  if (!parsed) {
    throw py::value_error("path: expected engine, zero, zero3-reduce-scatter or zero3-allreduce, got '" + path + "'");
  }
  b.path = *parsed;
  if (group_size < 1 || sp < 1) throw py::value_error("group_size and sp must be >= 1");
  b.group_size = group_size;
  b.sp = sp;
  b.has_moe = has_moe;
  return semantics::PlanBucketScaling(*p, b).Divisor();
}

// Reduction semantics (semantics/): the one DeepSpeed release table and the
// bucket divisors its policies plan, for the Python repro tools.
void RegisterSemantics(py::module_& m) {
  m.def("deepspeed_releases", &DeepSpeedReleaseTable);
  m.def("bucket_divisor", &BucketDivisor, py::arg("policy"), py::arg("path"), py::arg("group_size"), py::arg("sp"),
        py::arg("has_moe") = false);
  // The one list of loss recipe names (semantics/loss_recipes.cc): what the adapters accept as `loss=`.
  m.def("loss_recipes", [] { return semantics::KnownLossRecipes(); });
  // And the other spellings of some (the DeepSpeed loops' command lines): alias -> recipe, the same list.
  m.def("loss_recipe_aliases", [] {
    py::dict out;
    for (const auto& [alias, recipe] : semantics::LossRecipeAliases()) out[py::str(alias)] = recipe;
    return out;
  });
  // The reduction paths' names (semantics/reduction_path.h), in the enum's order: the one list the adapters check.
  m.def("reduction_paths", [] { return semantics::ReductionPathNames(); });
  // The path a bucket takes (semantics/reduction_path.h), by the names bucket_divisor takes.
  m.def(
      "reduction_path",
      [](int zero_stage, int64_t bucket_elements, int64_t reduce_bucket_size, bool reduce_scatter,
         bool contiguous_gradients) {
        semantics::ZeroSettings z;
        z.reduce_bucket_size = reduce_bucket_size;
        z.reduce_scatter = reduce_scatter;
        z.contiguous_gradients = contiguous_gradients;
        return semantics::ReductionPathName(semantics::ChooseReductionPath(zero_stage, z, bucket_elements));
      },
      py::arg("zero_stage"), py::arg("bucket_elements"), py::arg("reduce_bucket_size"), py::arg("reduce_scatter"),
      py::arg("contiguous_gradients"));
}

// The trace format's file names (proto/rank_file.h): what the recorders write and read_trace_set lists.
void RegisterRankFiles(py::module_& m) {
  m.def(
      "rank_file_name",
      [](int rank) {
        if (rank < 0) throw py::value_error("rank must be >= 0, got " + std::to_string(rank));
        return RankFileName(rank);
      },
      py::arg("rank"));
  m.def(
      "parse_rank_file_name", [](const std::string& name) { return ParseRankFileName(name); }, py::arg("name"));
  m.def("locked_by_writer", &LockedByWriter, py::arg("path"),
        "Whether a trace writer (of any process) holds path's lock now (it does while it writes).");
  m.def(
      "rank_file_member",
      [](const std::string& path) {
        auto rank = RankFileMember(path);
        ThrowIfFileError(rank.status());
        return *rank;
      },
      py::arg("path"));
  m.attr("RANK_FILE_PATTERN") = kRankFilePattern;
}

// The dtype table (proto/dtype.h): canonical names, sizes, aliases, and the numpy type of a values array.
void RegisterDTypes(py::module_& m) {
  m.def("dtypes", [] {
    py::list out;
    for (const DTypeInfo& row : DTypes()) {
      py::dict d;
      d["name"] = row.name;
      d["size"] = row.size;
      d["numpy"] = NumpyTypeString(row);
      d["aliases"] = DTypeAliases(row.dtype);
      out.append(d);
    }
    return out;
  });
  m.def(
      "dtype_name",
      [](const std::string& name) {
        pb::DType dtype = pb::DTYPE_UNSPECIFIED;
        if (!ParseDType(name, &dtype)) {
          throw py::value_error("unknown dtype '" + name + "': expected " + DTypeNamesInWords() +
                                " (any case) or an alias such as float32, half, bfloat16, double");
        }
        return std::string(DTypeName(dtype));
      },
      py::arg("name"));
}

}  // namespace
}  // namespace gradtrace

PYBIND11_MODULE(_gtcodec, m) {
  using namespace gradtrace;
  m.doc() = "Binding of the gradtrace C++ trace codec; use the `gradtrace` package, not this module.";
  RegisterTraceError(m);
  RegisterReader(m);
  RegisterWriter(m);
  RegisterCodecFunctions(m);
  RegisterSemantics(m);
  RegisterRankFiles(m);
  RegisterDTypes(m);
  RegisterJudge(m);
}
