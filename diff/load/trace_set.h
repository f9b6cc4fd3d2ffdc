// TraceSet: one run's directory of rank-NNNNN.gtrace files, checked for
// completeness and consistency, with a catalogue of its frames.
//
// Loading builds the catalogue (ranks in parallel): which step/micro-step/
// phase/bucket each frame holds and which parameters its slices touch. A
// format 1.1+ file with its index is catalogued from the index without
// decompressing any data frame; an older or truncated file is scanned once,
// its payloads dropped at once. The second pass (gather.h) reads only the
// frames a comparison needs, by offset.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gradtrace.pb.h"
#include "status.h"
#include "trace_reader.h"

namespace gradtrace::diff {

struct RankFile {
  int rank = 0;
  std::string path;    // how messages name it: the file, or "bug.gtpack:a/rank-00000.gtrace"
  TraceSource source;  // where its bytes are (a whole file or an archive member)
  uint64_t file_size = 0;
  bool truncated = false;    // cut short: every complete frame before stop_offset is used
  uint64_t stop_offset = 0;  // where reading stopped when truncated
  std::string truncation;    // the reader's one-line message when truncated
};

// Where one BucketRecord frame lives and what it covers.
struct FrameRef {
  int rank = 0;
  uint64_t offset = 0;
  int64_t step = 0;
  int32_t micro_step = 0;
  pb::Phase phase = pb::PHASE_UNSPECIFIED;
  int32_t bucket_id = 0;
  std::string group;
  std::vector<int32_t> param_ids;  // distinct, ascending
  uint64_t raw_bytes = 0;
  // Partition layout (ZeRO-1/2 POST_REDUCE) and the producer's declared divisor.
  int64_t bucket_numel = 0;
  int64_t partition_offset = 0;
  int64_t partition_count = 0;
  double divisor = 0;
};

struct RankStep {
  int rank = 0;
  pb::StepInfo info;
};

struct LoadOptions {
  int threads = 0;        // 0 = all cores
  bool use_index = true;  // false: scan every frame even when the index catalogues them
  // Called with (bytes scanned so far, total bytes) from any thread; may be empty.
  std::function<void(uint64_t, uint64_t)> progress;
};

class TraceSet {
 public:
  // Loads `dir`. Errors (one line, naming the file): no trace files, a file
  // that cannot be opened or is corrupt, a missing or duplicated rank, ranks
  // of different runs, inconsistent configuration or parameter table.
  // A truncated file is not an error: it is recorded in RankFile.
  // `dir` may also be a bug-report archive (archive.h): "bug.gtpack:a" names
  // its set a, "bug.gtpack" its only set; members are read in place.
  static Expected<TraceSet> Load(const std::string& dir, const LoadOptions& options = {});
  // The same checks over files already found: `name` is how the set is named
  // (dir()), each source is one rank's trace (rank from its name, as Load).
  static Expected<TraceSet> LoadSources(const std::string& name, std::vector<TraceSource> sources,
                                        const LoadOptions& options = {});

  const std::string& dir() const { return dir_; }
  const pb::RunInfo& run() const { return run0_; }  // rank 0's RunInfo
  const pb::Config& config() const { return run0_.config(); }
  // The parameter table every rank shares (params and model fingerprint of run()): readers of the set's files
  // validate against it instead of keeping a copy each (ReadOptions.table).
  const std::shared_ptr<const pb::RunInfo>& table() const { return table_; }
  int world() const { return static_cast<int>(ranks_.size()); }
  const std::vector<RankFile>& ranks() const { return ranks_; }
  const std::vector<FrameRef>& frames() const { return frames_; }
  const std::vector<RankStep>& steps() const { return steps_; }
  // Group members of `group` as seen by `rank` (empty if the rank has no such group).
  const std::vector<int>& GroupMembers(int rank, const std::string& group) const;
  uint64_t total_bytes() const { return total_bytes_; }
  bool truncated() const;
  // What loading inferred where the recorded layout was silent, one sentence
  // each (config() already holds it): e.g. gas from the micro-steps counted.
  const std::vector<std::string>& inferences() const { return inferences_; }

 private:
  std::string dir_;
  pb::RunInfo run0_;
  std::shared_ptr<const pb::RunInfo> table_;
  std::vector<RankFile> ranks_;
  std::vector<FrameRef> frames_;  // ordered by (rank, offset)
  std::vector<RankStep> steps_;
  // Per rank: its groups' names and members, each distinct member list stored once (shared by the ranks).
  std::vector<std::vector<std::pair<std::string, std::shared_ptr<const std::vector<int>>>>> groups_;
  uint64_t total_bytes_ = 0;
  std::vector<std::string> inferences_;

  void InferGas();
  void FoldPrecision();
};

// Prefixes `path: ` to a codec message unless it already names the file.
std::string NameFile(const std::string& path, const std::string& message);

// The rank files of set `set` of an archive ("" for its only set), as sources
// named "<archive>:<set>/rank-NNNNN.gtrace". InvalidArgument when the archive
// holds no such set, or several and `set` is empty.
Expected<std::vector<TraceSource>> ArchiveSetSources(const std::string& archive_path, const std::string& set);

}  // namespace gradtrace::diff
