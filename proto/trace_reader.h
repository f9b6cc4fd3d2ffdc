// TraceReader: reads one rank's trace file, never trusting it. Every declared
// size is checked against format.h's limits before anything is allocated.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "file_pool.h"
#include "format.h"
#include "gradtrace.pb.h"
#include "record_view.h"
#include "status.h"

namespace gradtrace {

struct Frame {
  uint64_t offset = 0;  // file offset of the frame header
  uint8_t type = 0;     // format::FrameType
  uint32_t stored_len = 0;
  uint32_t raw_len = 0;
  // Exactly one is set, matching `type`; unknown types (newer minor versions) leave both unset.
  std::unique_ptr<pb::StepInfo> step;
  std::unique_ptr<pb::BucketRecord> bucket;
};

// Where a trace lives: a whole file, or a byte window of one (a member of a
// bug-report archive, archive.h). Every offset the reader uses and reports is
// relative to the window and every bound is checked against it, never the file.
struct TraceSource {
  std::string path;              // the file to open
  uint64_t offset = 0;           // first byte of the trace in that file
  std::optional<uint64_t> size;  // bytes of the window; none: to the end of the file
  std::string name;              // how messages name it ("bug.gtpack:a/rank-00000.gtrace"); empty: path
  const std::string& display() const { return name.empty() ? path : name; }

  static TraceSource File(std::string path) {
    TraceSource s;
    s.path = std::move(path);
    return s;
  }
  static TraceSource Window(std::string path, uint64_t offset, uint64_t size, std::string name) {
    TraceSource s = File(std::move(path));
    s.offset = offset;
    s.size = size;
    s.name = std::move(name);
    return s;
  }
};

struct ReadOptions {
  bool use_index = true;  // false: always scan frames from the start
  // The set's table (a RunInfo whose params the set checked equal on every rank): when this file's RunInfo
  // validates and has the same model fingerprint and parameter count, its records are validated against
  // `table` and run_info() keeps neither its own parameter table nor its groups. A reader held per rank of a
  // 10,000-rank set otherwise held 10,000 copies of both (issue 42).
  std::shared_ptr<const pb::RunInfo> table;
};

class TraceReader {
 public:
  // Opens `path`, checks the file header and reads RunInfo (the first frame).
  // Fails with a one-line message naming the file and offset.
  static Expected<std::unique_ptr<TraceReader>> Open(const std::string& path, const ReadOptions& options = {});
  // The same for a window of a file; path() is then source.display().
  static Expected<std::unique_ptr<TraceReader>> Open(const TraceSource& source, const ReadOptions& options = {});
  ~TraceReader();

  const pb::RunInfo& run_info() const { return run_; }
  const std::string& path() const { return path_; }
  uint64_t file_size() const { return file_size_; }  // the window's size for an archive member
  bool has_index() const { return has_index_; }
  const pb::Index& index() const { return index_; }  // empty when !has_index()
  uint16_t minor_version() const { return minor_; }
  // True when the index is present and catalogues every BucketRecord frame
  // (format 1.1+: param ids, group, raw_len, partition, divisor): a reader can
  // then pick frames without decompressing any of them. Param ids are checked
  // against RunInfo's table.
  bool catalogued() const { return has_index_ && minor_ >= format::kMinorCataloguedIndex; }
  // Why the index was ignored when its frames are sound but their content is
  // not: a payload that does not parse within the limits (LimitExceeded or
  // Corruption), or entries outside the data, out of order or naming
  // parameters the table lacks (Corruption, naming the frame). Ok otherwise.
  // Reading then scans, which cannot see these; VerifyFile reports them.
  const Status& index_status() const { return index_status_; }

  // Reads the next StepInfo or BucketRecord frame (index frames are skipped).
  // Returns true and fills *frame; returns false at the end of the frames,
  // with status() ok for a clean end, Truncated for a file cut short (every
  // complete frame before it was returned), Corruption for a bad frame.
  bool Next(Frame* frame);
  const Status& status() const { return status_; }
  // Offset where reading stopped for a truncated or corrupt file.
  uint64_t stop_offset() const { return stop_offset_; }

  // Reads the frame at `offset` (e.g. from the index) without moving Next().
  // InvalidArgument for an offset outside the data frames; otherwise as Next().
  Status ReadAt(uint64_t offset, Frame* frame);

  // ReadAt in two steps, for a caller that skips decoding a frame whose stored
  // bytes equal those of one it decoded before (replicas write byte-identical
  // frames): ReadStoredAt reads the frame's header and stored payload, checking
  // its offset and declared sizes only; DecodeStored checks its CRC,
  // decompresses, parses and validates it (leaving `stored` as it was), with
  // ReadAt's results and messages.
  struct StoredFrame {
    uint64_t offset = 0;
    uint8_t header[format::kFrameHeaderSize] = {};
    std::string bytes;  // stored_len bytes, as in the file
    // The same header (its CRC included) and bytes: the same record, whichever file holds it.
    bool SameBytes(const StoredFrame& o) const {
      return std::memcmp(header, o.header, sizeof header) == 0 && bytes == o.bytes;
    }
  };
  Status ReadStoredAt(uint64_t offset, StoredFrame* out);
  Status DecodeStored(StoredFrame& stored, Frame* frame);
  // DecodeStored for a bucket record frame, its full slices' bytes viewed in
  // the decompressed payload instead of copied (record_view.h); the same
  // checks, and InvalidArgument for a frame of another type.
  Status DecodeStoredView(StoredFrame& stored, RecordView* out);
  // ReadStoredAt and DecodeStoredView in one pass over the stored bytes (issue
  // 24): they are read a piece at a time into a small buffer that stays in
  // cache, each piece added to the CRC and handed to zstd before the next is
  // read, so the payload is the only frame-sized buffer. `keep`, when given,
  // gets the stored bytes as ReadStoredAt would (to compare copies with).
  // A frame it cannot take that way (not zstd, any check failing, a short
  // read) goes through the two calls, whose results and messages it returns.
  Status ReadView(uint64_t offset, RecordView* out, StoredFrame* keep = nullptr);

  // A bucket record frame's record as stored: a reference's values_from not followed (format 1.6). Its CRC checked,
  // decompressed and parsed within the limits, not validated further: for comparing references, not for values.
  Status ParseStored(const StoredFrame& stored, pb::BucketRecord* out);
  // Whether frame `sb` of `b` holds the record that frame `sa` of `a` holds (decoded and checked before; its
  // values_from `from_a`, 0 for a frame that is not a reference), so that `sb` need not be decoded: replicas
  // (ranks that hold the same gradient) write byte-identical frames. A reference's bytes (format 1.6) say where
  // its values are, not what they are, and each rank's file lays its frames out at offsets of its own, so two
  // references hold the same record when they differ in values_from alone and their targets are byte for byte
  // the same, the copy's where its reader would look for it (values_from.h). Reads both targets' stored bytes.
  static bool SameRecord(TraceReader& a, const StoredFrame& sa, uint64_t from_a, TraceReader& b, const StoredFrame& sb);

  // Compressed and uncompressed payload bytes of all frames read so far.
  uint64_t stored_bytes() const { return stored_bytes_; }
  uint64_t raw_bytes() const { return raw_bytes_; }

 private:
  TraceReader() = default;
  // One frame, checked and decompressed, its payload not yet parsed.
  struct RawFrame {
    uint8_t type = 0;
    uint32_t stored_len = 0;
    uint32_t raw_len = 0;
    std::string payload;  // raw_len bytes
  };
  // Reads and checks the frame at `offset`, which must end by `limit`.
  Status ReadRaw(uint64_t offset, uint64_t limit, RawFrame* out, uint64_t* next);
  // ReadRaw's steps: the header (into hb) and stored bytes, bounds checked; then the CRC and decompression
  // (keep_stored: an uncompressed payload is copied out of `stored`, not taken).
  Status ReadStoredRaw(uint64_t offset, uint64_t limit, uint8_t* hb, std::string* stored, uint64_t* next);
  Status DecodeRaw(uint64_t offset, const uint8_t* hb, std::string& stored, bool keep_stored, RawFrame* out);
  Status DecodeBytes(uint64_t offset, const uint8_t* hb, std::string& stored, bool keep_stored, std::string* payload);
  Status ParseRaw(uint64_t offset, const RawFrame& raw, Frame* frame);
  // ReadView for a reference naming the frame `out` holds (a bucket's POST naming its PRE, read one after the
  // other into one view): that frame becomes its target where it is, not decoded again. False: not such a
  // reference (out unchanged; ReadView reads the frame as any); true: *st is the read's result.
  bool ReadReferenceOnto(uint64_t offset, RecordView* out, Status* st);
  static constexpr uint32_t kReferenceOntoLimit = uint32_t{1} << 20;  // raw bytes of a frame that may be one
  // What ReadValuesFrom checks of a decoded target (`where` names the reference and its values_from).
  Status CheckValuesFrom(const std::string& where, const pb::BucketRecord& ref,
                         const std::vector<std::string_view>* ref_data, const pb::BucketRecord& target,
                         const std::vector<std::string_view>* data) const;
  // ReadView's pass; false: take the two-step way (nothing is reported from here).
  bool ReadViewPieces(uint64_t offset, RecordView* out, StoredFrame* keep);
  // Its pass for a frame that must end by `limit`, decompressed into *payload.
  bool ReadPieces(uint64_t offset, uint64_t limit, std::string* payload, StoredFrame* keep);
  // DecodeStoredView's steps after decompression: the record's skeleton parsed, its bytes viewed, validated.
  Status ParseView(uint64_t offset, RecordView* out, bool keep_target = false);
  // DecodeStoredView; keep_target: a reference's target's stored bytes kept for SameRecord (LastTargetRead).
  Status DecodeView(StoredFrame& stored, RecordView* out, bool keep_target);
  // The stored bytes of a reference's target this thread read last for a caller comparing copies, by reader
  // (serial_, 0: none) and offset: SameRecord takes them instead of reading them again.
  struct KeptTarget {
    uint64_t reader = 0, from = 0;
    StoredFrame stored;
  };
  static KeptTarget& LastTargetRead();
  // Format 1.6: the frame `ref` (read at `offset`) takes its values from, read and decoded into *payload, checked
  // (a bucket record frame of this trace before `offset`, within the references' decode budget, matching `ref`:
  // values_from.h), its record's skeleton parsed into *target and its slices' bytes viewed in *data; keep_target:
  // its stored bytes kept too (LastTargetRead).
  Status ReadValuesFrom(uint64_t offset, const pb::BucketRecord& ref, const std::vector<std::string_view>* ref_data,
                        std::string* payload, std::string* skeleton, pb::BucketRecord* target,
                        std::vector<std::string_view>* data, bool keep_target = false);
  // Why `from` cannot be the target of the reference at `offset` by where it is (not an earlier data frame, not
  // listed by the index as a bucket record), or "" when it can.
  std::string ValuesFromPlaceProblem(uint64_t offset, uint64_t from) const;
  Status ReadFrameAt(uint64_t offset, Frame* frame, uint64_t* next);
  Status CheckDataOffset(uint64_t offset) const;
  // Open's steps: the file (or archive window), the file header, the RunInfo frame.
  Status OpenWindow(const TraceSource& source);
  Status ReadFileHeader();
  Status ReadRunInfo();
  bool TryLoadIndex();
  // Why the entries of one index frame cannot be trusted, or "" when they can. `before`: the entries of the
  // frames before it; *prev: the offset of the last entry so far (updated).
  std::string IndexEntriesProblem(const pb::Index& part, int64_t before, uint64_t index_offset, uint64_t* prev) const;
  Status ScanEnd(uint64_t offset);
  // Exactly `n` bytes at window offset `offset` (the caller checked they exist); IoError "<where>read failed: ..."
  // or the pool's error when the file cannot be opened again.
  Status ReadBytesAt(uint64_t offset, void* out, size_t n, const std::string& where);
  std::string Where(uint64_t offset) const;  // "<path>: offset <N>: "

  uint64_t serial_ = 0;  // this reader among those opened in the process, from 1
  std::string path_;
  std::unique_ptr<PooledFile> file_;  // open while the pool allows (file_pool.h)
  uint64_t base_ = 0;                 // window offset in file_: every read adds it
  uint64_t file_size_ = 0;
  uint64_t pos_ = 0;
  uint64_t end_of_frames_ = 0;  // footer/index start when indexed, else file size
  pb::RunInfo run_;
  std::shared_ptr<const pb::RunInfo> shared_table_;  // ReadOptions.table when taken: records validate against it
  const pb::RunInfo& table() const { return shared_table_ ? *shared_table_ : run_; }
  pb::Index index_;
  bool has_index_ = false;
  Status index_status_;
  Status status_;
  uint64_t stop_offset_ = 0;
  uint64_t stored_bytes_ = 0;
  uint64_t raw_bytes_ = 0;
  uint64_t reference_bytes_ = 0;  // decoded for values_from references, against their budget
  bool done_ = false;
  bool newer_minor_ = false;  // file written by a newer minor version
  uint16_t minor_ = 0;
  bool indexed_flag_ = false;       // header says the file ends with an index
  uint64_t first_data_offset_ = 0;  // just after RunInfo
  uint64_t index_run_offset_ = 0;   // scan mode: first of the trailing index frames
  bool last_was_index_ = false;     // scan mode: the previous frame was an index frame
};

// Reads every frame of `path` and checks every CRC; Truncated/Corruption say
// where. When the file has an index, also checks that it lists exactly the
// StepInfo and BucketRecord frames, in order, and what it says of each
// (index_entry.h); frames of types from a newer minor version are not listed.
// The inspection command's --verify.
Status VerifyFile(const std::string& path);
Status VerifyFile(const TraceSource& source);

}  // namespace gradtrace
