// libFuzzer target: a whole trace file, as gradtrace-inspect --verify reads it.
// Opens it with and without the index, reads every frame (and every indexed
// frame by offset), then runs VerifyFile; then the same with every frame's
// checksum fixed, so that mutations reach the payloads. Beyond the sanitizers
// it checks that every error is one line naming the file and an offset, and
// that a record the reader returns decodes, and decodes the same viewed
// (DecodeStoredView, record_view.h: the streamed diff's decode), and that
// ReadView (its one-pass read) answers at every frame and indexed offset
// exactly what the two-step read answers (into a fresh view and into one that
// holds the frame read before), and that the replica check
// (SameRecord) takes no frame for a copy that is not one.
#include <cstddef>
#include <cstdint>
#include <string>

#include "crc32c.h"
#include "format.h"
#include "frame_io.h"
#include "fuzz_common.h"
#include "slice_codec.h"
#include "trace_reader.h"
#include "values_from.h"

using namespace gradtrace;

namespace {

void CheckRecord(const pb::RunInfo& run, const pb::BucketRecord& rec) {
  for (const pb::Slice& s : rec.slices()) {
    if (!s.has_full()) continue;
    Expected<std::vector<double>> v = DecodeFullValues(s);
    if (!v.ok()) fuzz::Fail("a returned full slice does not decode: " + v.status().message());
    if (static_cast<int64_t>(v->size()) != s.count()) fuzz::Fail("decoded element count differs from the slice's");
    if (s.param_id() >= run.params_size()) fuzz::Fail("returned slice names an unknown param");
  }
}

void CheckView(TraceReader& r, const Frame& f) {
  TraceReader::StoredFrame stored;
  if (Status s = r.ReadStoredAt(f.offset, &stored); !s.ok())
    fuzz::Fail("a returned frame does not read: " + s.message());
  RecordView view;
  if (Status s = r.DecodeStoredView(stored, &view); !s.ok()) {
    fuzz::Fail("a returned record does not decode viewed: " + s.message());
  }
  if (view.record().slices_size() != f.bucket->slices_size()) fuzz::Fail("the viewed record has another slice count");
  for (int i = 0; i < f.bucket->slices_size(); ++i) {
    const pb::Slice& s = f.bucket->slices(i);
    if (s.has_full() && view.data(i) != s.full().data()) fuzz::Fail("a viewed slice holds other bytes");
  }
}

void SameView(const char* what, const RecordView& got, const RecordView& expected) {
  if (got.record().SerializeAsString() != expected.record().SerializeAsString()) {
    fuzz::Fail(std::string(what) + ": another record");
  }
  for (int i = 0; i < got.record().slices_size(); ++i) {
    if (got.data(i) != expected.data(i)) fuzz::Fail(std::string(what) + ": a slice holds other bytes");
  }
}

// ReadView at `offset` against ReadStoredAt + DecodeStoredView: the same status, words included, and the same
// record and bytes; likewise into `held`, the view every frame of the walk is read into (a reference naming the
// frame it holds resolves onto it), but where the references' decode budget ran out.
void CheckReadView(TraceReader& r, uint64_t offset, RecordView* held) {
  TraceReader::StoredFrame stored, kept;
  RecordView two, one;
  Status expected = r.ReadStoredAt(offset, &stored);
  if (expected.ok()) expected = r.DecodeStoredView(stored, &two);
  const Status got = r.ReadView(offset, &one, &kept);
  if (got.code() != expected.code() || got.message() != expected.message()) {
    fuzz::Fail("ReadView answers '" + got.message() + "', the two-step read '" + expected.message() + "'");
  }
  const Status onto = r.ReadView(offset, held);
  if (expected.code() != Status::Code::kLimitExceeded &&
      (onto.code() != expected.code() || onto.message() != expected.message())) {
    fuzz::Fail("ReadView into a held view answers '" + onto.message() + "', the two-step read '" + expected.message() +
               "'");
  }
  if (!got.ok()) return;
  SameView("ReadView", one, two);
  if (onto.ok()) SameView("ReadView into a held view", *held, two);
  if (!kept.SameBytes(stored)) fuzz::Fail("ReadView kept other stored bytes");
}

// The replica check (TraceReader::SameRecord) on neighbouring bucket record frames: where it says the frame at
// `offset` holds the record the last one decoded holds, that frame must read, and give the same record (but for
// where a reference's values are) and the same bytes.
struct Neighbours {
  TraceReader::StoredFrame stored[2];
  RecordView view[2];
  int last = -1;  // stored[last] and view[last] read and decoded; -1: none yet

  void Check(TraceReader& r, uint64_t offset) {
    const int here = last == 0 ? 1 : 0;
    const bool read = r.ReadStoredAt(offset, &stored[here]).ok();
    const bool decoded = read && r.DecodeStoredView(stored[here], &view[here]).ok();
    if (read && last >= 0) {
      const RecordView& a = view[last];
      if (TraceReader::SameRecord(r, stored[last], a.record().values_from(), r, stored[here])) {
        if (!decoded) fuzz::Fail("SameRecord took a frame that does not decode for the same record");
        const RecordView& b = view[here];
        if (WithoutValuesFrom(a.record()) != WithoutValuesFrom(b.record())) fuzz::Fail("SameRecord: another record");
        for (int i = 0; i < a.record().slices_size(); ++i) {
          if (a.data(i) != b.data(i)) fuzz::Fail("SameRecord: a slice holds other bytes");
        }
      }
    }
    if (decoded) last = here;
  }
};

void ReadAndVerify(fuzz::MemFile* file) {
  for (bool use_index : {true, false}) {
    Expected<std::unique_ptr<TraceReader>> opened = TraceReader::Open(file->path(), ReadOptions{use_index, nullptr});
    if (!opened.ok()) {
      fuzz::CheckErrorLine(opened.status(), file->path());
      break;
    }
    TraceReader& r = **opened;
    Frame f;
    uint64_t last = 0;
    Neighbours neighbours;
    RecordView held;
    while (r.Next(&f)) {
      if (f.offset < last) fuzz::Fail("frames returned out of order");
      last = f.offset;
      if (f.bucket) {
        CheckRecord(r.run_info(), *f.bucket);
        CheckView(r, f);
        neighbours.Check(r, f.offset);
      }
      CheckReadView(r, f.offset, &held);
    }
    fuzz::CheckErrorLine(r.status(), file->path());
    fuzz::CheckErrorLine(r.index_status(), file->path());
    if (r.has_index()) {
      for (const pb::IndexEntry& e : r.index().entries()) {
        Status s = r.ReadAt(e.offset(), &f);
        fuzz::CheckErrorLine(s, file->path());
        CheckReadView(r, e.offset(), &held);
        if (s.ok() && f.bucket) CheckRecord(r.run_info(), *f.bucket);
      }
    }
  }
  fuzz::CheckErrorLine(VerifyFile(file->path()), file->path());
}

// The input with every frame's checksum made right, walking frames by their
// stored_len: without this almost every mutation stops at the CRC check.
std::string FixChecksums(std::string bytes) {
  uint64_t off = format::kFileHeaderSize;
  while (off + format::kFrameHeaderSize <= bytes.size()) {
    auto* p = reinterpret_cast<uint8_t*>(bytes.data()) + off;
    const uint32_t stored = frame_io::GetU32(p);
    if (stored > bytes.size() - off - format::kFrameHeaderSize) break;
    const uint32_t crc =
        crc32c::Extend(crc32c::Value(p + frame_io::kCrcCoveredHeaderOffset, 4), p + format::kFrameHeaderSize, stored);
    frame_io::PutU32(p + 8, crc32c::Mask(crc));
    off += format::kFrameHeaderSize + stored;
  }
  return bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile* file = new fuzz::MemFile();
  file->Set(data, size);
  ReadAndVerify(file);
  const std::string input(reinterpret_cast<const char*>(data), size);
  const std::string fixed = FixChecksums(input);
  if (fixed != input) {
    file->Set(fixed);
    ReadAndVerify(file);
  }
  return 0;
}
