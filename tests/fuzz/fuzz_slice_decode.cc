// libFuzzer target: a BucketRecord payload against the fixed FuzzRun() model,
// parsed with the limits and validated as the reader does. A record that
// passes must decode: full slices to exactly `count` elements and back to the
// same bytes, sketch slices against the parameter's sketch positions; and
// splitting it into chunks and merging them must give it back. Whatever it
// is, the streamed diff's view of it (record_view.h), when taken, must be the
// record protobuf parses: the skeleton parses exactly when the payload does,
// and with the viewed bytes put back it is the same record.
#include <cstddef>
#include <cstdint>

#include "chunking.h"
#include "fuzz_common.h"
#include "parse_limits.h"
#include "record_view.h"
#include "slice_codec.h"
#include "validate.h"

using namespace gradtrace;

namespace {

void CheckSlice(const pb::RunInfo& run, const pb::Slice& s) {
  const pb::ParamInfo& p = run.params(s.param_id());
  const size_t w = DTypeSize(s.dtype());
  if (s.has_full()) {
    Expected<std::vector<double>> v = DecodeFullValues(s);
    Expected<std::string> b = DecodeFullBytes(s);
    if (!v.ok() || !b.ok()) fuzz::Fail("a valid full slice does not decode");
    if (static_cast<int64_t>(v->size()) != s.count() || b->size() != static_cast<size_t>(s.count()) * w) {
      fuzz::Fail("decoded sizes differ from the slice's count");
    }
    for (int64_t i = 0; i < s.count(); ++i) {
      const double x = ElementToDouble(s.dtype(), reinterpret_cast<const uint8_t*>(b->data()) + i * w);
      if (!(x == (*v)[i] || (x != x && (*v)[i] != (*v)[i]))) fuzz::Fail("DecodeFullValues disagrees with the bytes");
    }
    // Re-encoding the bytes gives the same elements.
    const pb::Slice again = MakeSlice(p, s.offset(), s.count(), s.dtype(), b->data(), CaptureMode{});
    Expected<std::string> b2 = DecodeFullBytes(again);
    if (!b2.ok() || *b2 != *b) fuzz::Fail("full slice does not survive re-encoding");
  } else if (s.has_sketch()) {
    // Only the count is bounded by validation; the positions need not be the parameter's.
    const std::vector<int64_t> pos = SketchPositions(p.name(), p.numel(), s.sketch().k());
    if (static_cast<int64_t>(pos.size()) > p.numel()) fuzz::Fail("more sketch positions than elements");
    for (double v : s.sketch().values()) {
      uint8_t e[8];
      DoubleToElement(s.dtype(), v, e);
      (void)ElementToDouble(s.dtype(), e);
    }
  }
}

void CheckRecordView(const std::string& payload) {
  std::string skeleton;
  std::vector<std::string_view> data;
  if (!SplitFullData(payload, &skeleton, &data)) return;
  pb::BucketRecord whole, split;
  const bool whole_ok = whole.ParseFromString(payload), split_ok = split.ParseFromString(skeleton);
  if (whole_ok != split_ok) fuzz::Fail("the record view's skeleton parses where the payload does not, or the reverse");
  if (!whole_ok) return;
  if (data.size() != static_cast<size_t>(whole.slices_size())) fuzz::Fail("the record view has another slice count");
  for (int i = 0; i < split.slices_size(); ++i) {
    if (!split.slices(i).has_full()) continue;
    if (!split.slices(i).full().data().empty()) fuzz::Fail("the record view's skeleton kept a slice's bytes");
    split.mutable_slices(i)->mutable_full()->set_data(std::string(data[static_cast<size_t>(i)]));
  }
  if (split.SerializeAsString() != whole.SerializeAsString()) fuzz::Fail("the record view is another record");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const pb::RunInfo* run = new pb::RunInfo(fuzz::FuzzRun());
  pb::BucketRecord rec;
  const std::string payload(reinterpret_cast<const char*>(data), size);
  CheckRecordView(payload);
  if (Status s = ParseBounded(payload, ParseLimitsFor(format::FrameType::kBucketRecord), &rec); !s.ok()) {
    fuzz::CheckOneLine(s);
    return 0;
  }
  if (Status s = ValidateBucketRecord(*run, rec); !s.ok()) {
    fuzz::CheckOneLine(s);
    return 0;
  }
  for (const pb::Slice& s : rec.slices()) CheckSlice(*run, s);

  // Split into small chunks and merge back, as the writer and readers do.
  rec.DiscardUnknownFields();
  rec.set_chunk(0);
  rec.set_chunk_count(0);
  rec.set_last_slice_continues(false);
  Expected<std::vector<pb::BucketRecord>> chunks = SplitRecord(rec, 256);
  if (!chunks.ok()) return 0;  // an uncuttable slice larger than the target
  for (const pb::BucketRecord& c : *chunks) {
    if (Status s = ValidateBucketRecord(*run, c); !s.ok()) fuzz::Fail("a chunk does not validate: " + s.message());
  }
  Expected<pb::BucketRecord> merged = MergeChunks(*chunks);
  if (!merged.ok()) fuzz::Fail("chunks do not merge: " + merged.status().message());
  if (merged->SerializeAsString() != rec.SerializeAsString()) fuzz::Fail("split + merge changed the record");
  return 0;
}
