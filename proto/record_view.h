// A BucketRecord whose full slices' bytes stay where decompression put them
// (issue 24: protobuf's parse copies every one of them once more, 16 % of a
// streamed diff's CPU). The record is protobuf's own parse of the payload less
// those bytes (its "skeleton"), so every other field, unknown fields and the
// parse limits included, means what it means to the one codec; the bytes are
// views into the payload.
//
// SplitFullData takes the shape every writer produces: fields of the record at
// the top, each slice holding at most one `full` with at most one `data`, no
// groups. Anything else (legal protobuf that merges or repeats those fields,
// or bytes that are not well-formed) it declines, and the reader parses the
// payload whole instead, with the usual copy and the usual errors.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gradtrace.pb.h"

namespace gradtrace {

// `payload` less the bytes of every Slice.full.data (their fields kept, empty)
// into *skeleton; (*data)[i] the bytes of slice i's data (empty when it has
// none), a view into `payload`. False: not the shape above (outputs unusable).
bool SplitFullData(std::string_view payload, std::string* skeleton, std::vector<std::string_view>* data);

// A decoded bucket record frame with its full slices' bytes viewed, not
// copied: record.slices(i)'s full payload, when it has one, holds its bytes in
// data(i) and none in record. Reused across frames, its buffers keep their
// memory (no page faults per frame).
class RecordView {
 public:
  const pb::BucketRecord& record() const { return record_; }
  std::string_view data(int slice) const { return data_[static_cast<size_t>(slice)]; }
  uint32_t raw_len() const { return static_cast<uint32_t>(payload_.size()); }
  // The memory it holds for its frame: the decompressed bytes (and for a
  // reference, format 1.6 record().values_from(), those of the frame its
  // values are in), the views and the parsed record. A stats frame's parse
  // (a Slice and its moments per slice, ~100 bytes each) is several times its
  // payload: counted by payload alone, a reader cache's 48 MiB held 350 MB
  // at 10,000 ranks (issue 42).
  // Counted once per frame (SpaceUsedLong walks every slice; StreamCache asks for each live slot per lookup).
  uint64_t held_bytes() const {
    if (held_ == 0) {
      const bool reference = record_.values_from() != 0;
      held_ = payload_.size() + skeleton_.size() + data_.size() * sizeof(std::string_view) + record_.SpaceUsedLong() +
              (reference ? target_payload_.size() + target_skeleton_.size() + target_record_.SpaceUsedLong() : 0);
    }
    return held_;
  }

 private:
  friend class TraceReader;
  std::string payload_;  // the decompressed frame; data_ may point into it
  std::string skeleton_;
  pb::BucketRecord record_;
  std::vector<std::string_view> data_;
  // A reference's target: data_ then points into target_payload_. Otherwise it holds the last reference's target,
  // unused: a buffer that keeps its size is not zero-filled again when the next one is decoded into it.
  std::string target_payload_;
  std::string target_skeleton_;
  pb::BucketRecord target_record_;
  // The frame payload_ holds when it is not a reference and was laid out as a writer lays it out: its reader
  // (TraceReader's serial; 0: none) and offset. A reference read next into this view that names it takes its
  // values from here instead of decoding that frame again (TraceReader::ReadView).
  uint64_t frame_reader_ = 0;
  uint64_t frame_offset_ = 0;
  mutable uint64_t held_ = 0;  // held_bytes() of the frame it holds; 0: not counted yet (the reader resets it)
};

}  // namespace gradtrace
