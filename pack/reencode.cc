#include "reencode.h"

#include <map>
#include <vector>

#include "chunking.h"
#include "trace_writer.h"

namespace gradtrace::pack {
namespace {

// Replaces the full slices of `record` whose parameter has a mode.
Status Convert(const pb::RunInfo& run, const std::vector<const CaptureMode*>& mode_of,
               std::map<std::pair<int32_t, int32_t>, std::vector<int64_t>>* positions, pb::BucketRecord* record) {
  for (pb::Slice& slice : *record->mutable_slices()) {
    const CaptureMode* mode = mode_of[slice.param_id()];
    if (!slice.has_full() || mode == nullptr || mode->kind == CaptureMode::Kind::kFull) continue;
    auto bytes = DecodeFullBytes(slice);
    if (!bytes.ok()) return bytes.status();
    const pb::ParamInfo& param = run.params(slice.param_id());
    const std::vector<int64_t>* cached = nullptr;
    if (mode->kind == CaptureMode::Kind::kSketch) {
      auto key = std::make_pair(slice.param_id(), mode->k);
      auto it = positions->find(key);
      if (it == positions->end()) {
        it = positions->emplace(key, SketchPositions(param.name(), param.numel(), mode->k)).first;
      }
      cached = &it->second;
    }
    slice = MakeSlice(param, slice.offset(), slice.count(), slice.dtype(), bytes->data(), *mode, cached);
  }
  return Status::Ok();
}

}  // namespace

Expected<uint64_t> ReencodeTrace(const TraceSource& source, const std::string& out_path,
                                 const std::unordered_map<std::string, CaptureMode>& modes) {
  auto opened = TraceReader::Open(source);
  if (!opened.ok()) return opened.status();
  TraceReader& reader = **opened;
  const pb::RunInfo& run = reader.run_info();
  std::vector<const CaptureMode*> mode_of(run.params_size(), nullptr);
  for (int i = 0; i < run.params_size(); ++i) {
    auto it = modes.find(run.params(i).name());
    if (it != modes.end()) mode_of[i] = &it->second;
  }
  auto writer = TraceWriter::Open(out_path, run);
  if (!writer.ok()) return writer.status();
  std::map<std::pair<int32_t, int32_t>, std::vector<int64_t>> positions;
  // A record split across frames is joined first (its chunks are written
  // back to back), so a cut full slice becomes one sketch or stats slice.
  std::vector<pb::BucketRecord> chunks;
  Frame frame;
  while (reader.Next(&frame)) {
    if (frame.step) {
      GT_RETURN_IF_ERROR((*writer)->WriteStep(*frame.step));
      continue;
    }
    if (!frame.bucket) continue;
    chunks.push_back(std::move(*frame.bucket));
    const int32_t count = chunks.front().chunk_count();
    if (count > 1 && static_cast<int32_t>(chunks.size()) < count) continue;
    auto record = MergeChunks(std::move(chunks));
    chunks.clear();
    if (!record.ok()) return Status::Corruption(source.display() + ": " + record.status().message());
    record->clear_chunk();
    record->clear_chunk_count();
    record->clear_last_slice_continues();
    GT_RETURN_IF_ERROR(Convert(run, mode_of, &positions, &*record));
    GT_RETURN_IF_ERROR((*writer)->WriteBucket(*record));
  }
  if (!reader.status().ok() && reader.status().code() != Status::Code::kTruncated) return reader.status();
  GT_RETURN_IF_ERROR((*writer)->Close());
  return (*writer)->bytes_written();
}

}  // namespace gradtrace::pack
