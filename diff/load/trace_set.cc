#include "load/trace_set.h"

#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string_view>
#include <unordered_map>

#include "archive.h"
#include "compare/tolerance.h"
#include "format.h"
#include "index_entry.h"
#include "load/thread_pool.h"
#include "rank_file.h"
#include "sketch.h"
#include "slice_codec.h"
#include "trace_reader.h"

namespace gradtrace::diff {
namespace fs = std::filesystem;

std::string NameFile(const std::string& path, const std::string& message) {
  if (message.rfind(path, 0) == 0) return message;
  std::string base = fs::path(path).filename().string();
  if (!base.empty() && message.find(base) != std::string::npos) return message;
  return path + ": " + message;
}

namespace {

using Members = std::shared_ptr<const std::vector<int>>;

// Group member lists stored once however many ranks list them: every rank of a 10,000-rank set lists the same
// world group, 10,000^2 members if each kept its own copy (issue 42: 6.3 GB for a 314 MB pair of sets).
class GroupInterner {
 public:
  Members Intern(const google::protobuf::RepeatedField<int32_t>& ranks) {
    std::vector<int> v(ranks.begin(), ranks.end());
    const uint64_t h =
        sketch::Fnv1a64(std::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int)));
    std::lock_guard<std::mutex> lock(mu_);
    auto& bucket = by_hash_[h];
    for (const Members& m : bucket) {
      if (*m == v) return m;
    }
    bucket.push_back(std::make_shared<const std::vector<int>>(std::move(v)));
    return bucket.back();
  }

 private:
  std::mutex mu_;
  std::unordered_map<uint64_t, std::vector<Members>> by_hash_;
};

struct ScanResult {
  Status status;
  // The rank's RunInfo; past the first file, without its groups (`groups` has them) and, when it equals the
  // first file's (`table_hash`), without its parameter table (`params` counts it).
  pb::RunInfo run;
  std::vector<std::pair<std::string, Members>> groups;
  uint64_t table_hash = 0;
  int params = 0;
  RankFile file;
  std::vector<FrameRef> frames;
  std::vector<RankStep> steps;
};

// A hash of the parameter table as CheckSameRun compares it (init_sketch aside).
uint64_t TableHash(const pb::RunInfo& run) {
  uint64_t h = sketch::kFnvOffset;
  std::string bytes;
  for (const pb::ParamInfo& p : run.params()) {
    if (p.init_sketch_size() == 0) {
      p.SerializeToString(&bytes);
    } else {
      pb::ParamInfo bare = p;
      bare.clear_init_sketch();
      bare.SerializeToString(&bytes);
    }
    h = sketch::Fnv1a64(bytes, h ^ bytes.size());
  }
  return h;
}

// Keeps of `r` what the checks and the set need, once: its groups interned, and (past the first file) its
// parameter table only when it differs from the first file's, for CheckSameRun's message.
void Slim(ScanResult* r, GroupInterner* groups, const uint64_t* first_table) {
  if (!r->status.ok()) return;
  for (const pb::ProcessGroup& g : r->run.groups()) r->groups.emplace_back(g.name(), groups->Intern(g.ranks()));
  r->params = r->run.params_size();
  r->table_hash = TableHash(r->run);
  if (first_table == nullptr) return;
  // Swapped out to be freed: clear() keeps the elements allocated for reuse.
  google::protobuf::RepeatedPtrField<pb::ProcessGroup>().Swap(r->run.mutable_groups());
  if (r->table_hash == *first_table) google::protobuf::RepeatedPtrField<pb::ParamInfo>().Swap(r->run.mutable_params());
}

// The catalogue entry of one BucketRecord frame (index_entry.h: the same
// fields whether they come from the index or from the frame itself).
FrameRef RefFromEntry(int rank, const pb::IndexEntry& e) {
  FrameRef ref;
  ref.rank = rank;
  ref.offset = e.offset();
  ref.step = e.step();
  ref.micro_step = e.micro_step();
  ref.phase = e.phase();
  ref.bucket_id = e.bucket_id();
  ref.group = e.group();
  ref.raw_bytes = e.raw_len();
  ref.bucket_numel = e.bucket_numel();
  ref.partition_offset = e.partition_offset();
  ref.partition_count = e.partition_count();
  ref.divisor = e.divisor();
  ref.param_ids.assign(e.param_ids().begin(), e.param_ids().end());
  return ref;
}

// Format 1.1+ with an index: the catalogue comes from the index alone; only
// the (small) StepInfo frames are read. No data frame is decompressed.
void CatalogueFromIndex(TraceReader& reader, ScanResult* out) {
  const int rank = out->run.rank();
  for (const pb::IndexEntry& e : reader.index().entries()) {
    if (e.type() == static_cast<uint32_t>(format::FrameType::kStepInfo)) {
      Frame frame;
      if (Status s = reader.ReadAt(e.offset(), &frame); !s.ok() || !frame.step) {
        out->status =
            Status::Corruption(NameFile(reader.path(), s.ok() ? "index lists a StepInfo frame at offset " +
                                                                    std::to_string(e.offset()) + " that is not one"
                                                              : s.message()));
        return;
      }
      out->steps.push_back(RankStep{rank, *frame.step});
    } else if (e.type() == static_cast<uint32_t>(format::FrameType::kBucketRecord)) {
      out->frames.push_back(RefFromEntry(rank, e));
    }
  }
}

void ScanFile(const TraceSource& source, bool use_index, std::atomic<uint64_t>* done, uint64_t total,
              const std::function<void(uint64_t, uint64_t)>& progress, ScanResult* out) {
  const std::string& path = source.display();
  auto opened = TraceReader::Open(source, ReadOptions{.use_index = use_index, .table = nullptr});
  if (!opened.ok()) {
    out->status = Status::Corruption(NameFile(path, opened.status().message()));
    return;
  }
  TraceReader& reader = **opened;
  out->run = reader.run_info();
  out->file.path = path;
  out->file.source = source;
  out->file.file_size = reader.file_size();
  out->file.rank = out->run.rank();
  if (reader.catalogued()) {
    CatalogueFromIndex(reader, out);
    if (progress) progress(done->fetch_add(reader.file_size()) + reader.file_size(), total);
    return;
  }
  Frame frame;
  uint64_t last = 0;
  while (reader.Next(&frame)) {
    if (frame.step) {
      out->steps.push_back(RankStep{out->run.rank(), *frame.step});
    } else if (frame.bucket) {
      pb::IndexEntry e = CatalogueEntry(*frame.bucket);
      e.set_offset(frame.offset);
      e.set_raw_len(frame.raw_len);
      out->frames.push_back(RefFromEntry(out->run.rank(), e));
    }
    frame = Frame();
    if (progress) {
      uint64_t pos = reader.stored_bytes();
      if (pos - last > (8u << 20)) {
        progress(done->fetch_add(pos - last) + (pos - last), total);
        last = pos;
      }
    }
  }
  done->fetch_add(reader.file_size() - last);
  const Status& st = reader.status();
  if (st.code() == Status::Code::kTruncated) {
    out->file.truncated = true;
    out->file.stop_offset = reader.stop_offset();
    out->file.truncation = NameFile(path, st.message());
  } else if (!st.ok()) {
    out->status = Status::Corruption(NameFile(path, st.message()));
  }
}

std::string ConfigLine(const pb::Config& c) {
  std::string line =
      "world " + std::to_string(c.world()) + ", dp " + std::to_string(c.dp()) + ", sp " + std::to_string(c.sp());
  for (auto [name, degree] : {std::pair{"cp", c.cp()}, {"tp", c.tp()}, {"pp", c.pp()}})
    if (degree > 1) line += std::string(", ") + name + " " + std::to_string(degree);
  return line;
}

// dp x sp x cp x tp x pp, the ranks a dense parameter's layout spans (a degree
// not recorded counts 1), with the factors named for an error message.
std::pair<int64_t, std::string> DenseWorld(const pb::Config& c) {
  int64_t product = 1;
  std::string names;
  for (auto [name, degree] :
       {std::pair{"dp", c.dp()}, {"sp", c.sp()}, {"cp", c.cp()}, {"tp", c.tp()}, {"pp", c.pp()}}) {
    if (degree <= 0) continue;
    product *= degree;
    names += (names.empty() ? "" : " x ") + std::string(name) + " " + std::to_string(degree);
  }
  return {product, names};
}

}  // namespace

bool TraceSet::truncated() const {
  return std::any_of(ranks_.begin(), ranks_.end(), [](const RankFile& f) { return f.truncated; });
}

const std::vector<int>& TraceSet::GroupMembers(int rank, const std::string& group) const {
  static const std::vector<int> kEmpty;
  if (rank < 0 || rank >= static_cast<int>(groups_.size())) return kEmpty;
  for (const auto& [name, members] : groups_[rank]) {
    if (name == group) return *members;
  }
  return kEmpty;
}

Expected<TraceSet> TraceSet::Load(const std::string& dir, const LoadOptions& options) {
  if (auto [archive, set] = SplitArchiveArg(dir); LooksLikeArchive(archive)) {
    auto sources = ArchiveSetSources(archive, set);
    if (!sources.ok()) return sources.status();
    return LoadSources(dir, std::move(*sources), options);
  }
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    if (fs::exists(dir, ec))
      return Status::InvalidArgument(dir + ": not a directory (expected a trace set: a directory of " +
                                     kRankFilePattern + ")");
    return Status::IoError(dir + ": no such directory");
  }
  std::vector<TraceSource> sources;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    auto rank = RankFileMember(entry.path().string());
    if (!rank.ok()) return rank.status();
    if (*rank) sources.push_back(TraceSource::File(entry.path().string()));
  }
  if (ec) return Status::IoError(dir + ": cannot list: " + ec.message());
  if (sources.empty()) return Status::InvalidArgument(dir + ": no " + kRankFilePattern + " files");
  return LoadSources(dir, std::move(sources), options);
}

Expected<std::vector<TraceSource>> ArchiveSetSources(const std::string& archive_path, const std::string& set) {
  auto archive = Archive::Open(archive_path);
  if (!archive.ok()) return archive.status();
  // set name -> its rank members
  std::map<std::string, std::vector<TraceSource>> sets;
  for (const ArchiveMember& m : archive->members()) {
    const size_t slash = m.name.find('/');
    if (slash == std::string::npos || m.name.find('/', slash + 1) != std::string::npos) continue;  // SET/FILE only
    auto rank = RankFileMember(archive->NameOf(m));
    if (!rank.ok() && (set.empty() || m.name.compare(0, slash, set) == 0)) return rank.status();
    if (!rank.ok() || !*rank) continue;
    sets[m.name.substr(0, slash)].push_back(TraceSource::Window(archive_path, m.offset, m.size, archive->NameOf(m)));
  }
  std::string names;
  for (const auto& [name, members] : sets) names += (names.empty() ? "" : ", ") + name;
  if (sets.empty())
    return Status::InvalidArgument(archive_path + ": archive holds no trace set (no SET/" + kRankFilePattern + ")");
  if (set.empty()) {
    if (sets.size() == 1) return std::move(sets.begin()->second);
    return Status::InvalidArgument(archive_path + ": archive holds trace sets " + names + ": name one, as " +
                                   archive_path + ":" + sets.begin()->first);
  }
  auto it = sets.find(set);
  if (it == sets.end()) {
    return Status::InvalidArgument(archive_path + ": archive holds no trace set '" + set + "' (it holds " + names +
                                   ")");
  }
  return std::move(it->second);
}

namespace {

// Every source named as RankFileName names it, no rank twice (an archive may hold a member twice).
Status CheckRankNames(const std::vector<TraceSource>& sources) {
  std::map<int, std::vector<std::string>> by_rank;
  for (const TraceSource& s : sources) {
    auto rank = RankFileMember(s.display());
    if (!rank.ok()) return rank.status();
    if (!*rank) return Status::InvalidArgument(s.display() + ": not a " + kRankFilePattern + " file");
    by_rank[**rank].push_back(s.display());
  }
  for (auto& [rank, ps] : by_rank) {
    if (ps.size() > 1) {
      std::sort(ps.begin(), ps.end());
      return Status::InvalidArgument(ps[1] + ": duplicate rank " + std::to_string(rank) + " (also " + ps[0] + ")");
    }
  }
  return Status::Ok();
}

// Catalogues every file (ranks in parallel); the first file's error, if any.
Status ScanAll(const std::vector<TraceSource>& sources, const LoadOptions& options, uint64_t* total,
               std::vector<ScanResult>* results) {
  *total = 0;
  for (const TraceSource& s : sources) {
    std::error_code ec;
    *total += s.size ? *s.size : fs::file_size(s.path, ec);
  }
  std::atomic<uint64_t> done{0};
  results->assign(sources.size(), ScanResult{});
  // The first file alone, then the others against its table, each slimmed as soon as it is read.
  GroupInterner groups;
  ScanFile(sources[0], options.use_index, &done, *total, options.progress, &(*results)[0]);
  Slim(&(*results)[0], &groups, nullptr);
  const uint64_t first_table = (*results)[0].table_hash;
  ParallelFor(sources.size() - 1, ResolveThreads(options.threads), [&](size_t i, int) {
    ScanFile(sources[i + 1], options.use_index, &done, *total, options.progress, &(*results)[i + 1]);
    Slim(&(*results)[i + 1], &groups, &first_table);
  });
  if (options.progress) options.progress(*total, *total);
  for (const auto& r : *results) {
    if (!r.status.ok()) return r.status;
  }
  return Status::Ok();
}

// The rank each RunInfo claims agrees with its file name, once each; fills rank -> index.
Status CheckRankClaims(const std::vector<ScanResult>& results, const std::vector<std::string>& paths,
                       std::map<int, size_t>* seen) {
  for (size_t i = 0; i < results.size(); ++i) {
    int claimed = results[i].run.rank();
    const int named = ParseRankFileName(fs::path(paths[i]).filename().string()).value();  // CheckRankNames passed
    if (claimed != named) {
      return Status::Mismatch(paths[i] + ": file name says rank " + std::to_string(named) + " but RunInfo says rank " +
                              std::to_string(claimed));
    }
    if (!seen->emplace(claimed, i).second)
      return Status::InvalidArgument(paths[i] + ": duplicate rank " + std::to_string(claimed));
  }
  return Status::Ok();
}

// Every rank's RunInfo is of the same run: run id, configuration, model and parameter table.
Status CheckSameRun(const std::vector<ScanResult>& results, const std::vector<std::string>& paths) {
  using google::protobuf::util::MessageDifferencer;
  const pb::RunInfo& run0 = results[0].run;
  const std::string& path0 = paths[0];
  for (size_t i = 1; i < results.size(); ++i) {
    const pb::RunInfo& run = results[i].run;
    if (run.run_id() != run0.run_id()) {
      return Status::Mismatch(paths[i] + ": run_id '" + run.run_id() + "' differs from '" + run0.run_id() + "' of " +
                              path0 + " (mixed runs in one directory)");
    }
    if (!MessageDifferencer::Equals(run.config(), run0.config())) {
      return Status::Mismatch(paths[i] + ": configuration differs from " + path0 + " (" + ConfigLine(run.config()) +
                              " vs " + ConfigLine(run0.config()) + ")");
    }
    if (run.model_fingerprint() != run0.model_fingerprint() || results[i].params != results[0].params) {
      // A pipeline captured stage by stage (format 1.5 tables name the whole model on every rank).
      const bool stages = run0.config().pp() > 1 && run0.params_size() > 0 && run0.params(0).stages_size() == 0;
      return Status::Mismatch(
          paths[i] + ": model fingerprint " + run.model_fingerprint() + " differs from " + run0.model_fingerprint() +
          " of " + path0 +
          (stages ? " (pp " + std::to_string(run0.config().pp()) +
                        ": each rank recorded only its own stage's parameters; attach to the pipeline schedule or "
                        "PipelineStage, e.g. gradtrace.manual_adapter.attach(schedule, ...), so that every rank's "
                        "table names the whole model)"
                  : " (different models)"));
    }
    if (results[i].table_hash == results[0].table_hash) continue;  // Slim dropped the equal table
    // Ranks holding different shards sketch no initial values, or other ones: not part of the table's identity.
    MessageDifferencer same_param;
    same_param.IgnoreField(pb::ParamInfo::descriptor()->FindFieldByName("init_sketch"));
    for (int p = 0; p < run.params_size(); ++p) {
      if (!same_param.Compare(run.params(p), run0.params(p))) {
        return Status::Mismatch(paths[i] + ": parameter table differs from " + path0 + " at id " + std::to_string(p) +
                                " ('" + run.params(p).name() + "' vs '" + run0.params(p).name() + "')");
      }
    }
  }
  return Status::Ok();
}

// The world the configuration states (or the files present), its layout's
// degrees multiplying to it, and exactly its ranks present.
Expected<int> CheckWorld(const pb::RunInfo& run0, const std::map<int, size_t>& seen, const std::string& dir,
                         const std::string& path0, const std::vector<std::string>& paths) {
  int world = run0.config().world();
  if (world <= 0) world = static_cast<int>(seen.size());
  if (auto [dense, names] = DenseWorld(run0.config());
      run0.config().dp() > 0 && dense != world && run0.config().moe_experts() == 0) {
    return Status::Mismatch(path0 + ": configuration says world " + std::to_string(world) + " but " + names + " = " +
                            std::to_string(dense));
  }
  for (int r = 0; r < world; ++r) {
    if (!seen.count(r)) {
      return Status::InvalidArgument((fs::path(dir) / RankFileName(r)).string() + ": missing (rank " +
                                     std::to_string(r) + " of world " + std::to_string(world) + ")");
    }
  }
  for (const auto& [rank, i] : seen) {
    if (rank >= world) {
      return Status::InvalidArgument(paths[i] + ": rank " + std::to_string(rank) + " outside world " +
                                     std::to_string(world));
    }
  }
  return world;
}

// Group members index the set's ranks. The reader checks them against a recorded world (proto/validate.cc);
// a world left unrecorded is the number of rank files, known only here.
Status CheckGroupMembers(const std::vector<ScanResult>& results, const std::vector<std::string>& paths, int world) {
  std::set<const std::vector<int>*> checked;  // each interned list once
  for (size_t i = 0; i < results.size(); ++i) {
    for (const auto& [name, members] : results[i].groups) {
      if (!checked.insert(members.get()).second) continue;
      for (int32_t m : *members) {
        if (m >= world) {
          return Status::Corruption(paths[i] + ": group '" + name + "': rank " + std::to_string(m) + " outside world " +
                                    std::to_string(world));
        }
      }
    }
  }
  return Status::Ok();
}

// Param ids in slices must index the table (hostile or buggy producers).
Status CheckParamIds(const std::vector<ScanResult>& results, const std::vector<std::string>& paths, int params) {
  for (size_t i = 0; i < results.size(); ++i) {
    for (const FrameRef& f : results[i].frames) {
      for (int32_t id : f.param_ids) {
        if (id < 0 || id >= params) {
          return Status::Corruption(paths[i] + ": frame at offset " + std::to_string(f.offset) +
                                    " refers to parameter id " + std::to_string(id) + " (table has " +
                                    std::to_string(params) + ")");
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Expected<TraceSet> TraceSet::LoadSources(const std::string& dir, std::vector<TraceSource> sources,
                                         const LoadOptions& options) {
  if (sources.empty()) return Status::InvalidArgument(dir + ": no " + kRankFilePattern + " files");
  GT_RETURN_IF_ERROR(CheckRankNames(sources));
  std::sort(sources.begin(), sources.end(),
            [](const TraceSource& x, const TraceSource& y) { return x.display() < y.display(); });
  std::vector<std::string> paths;
  for (const TraceSource& s : sources) paths.push_back(s.display());

  uint64_t total = 0;
  std::vector<ScanResult> results;
  GT_RETURN_IF_ERROR(ScanAll(sources, options, &total, &results));
  std::map<int, size_t> seen;
  GT_RETURN_IF_ERROR(CheckRankClaims(results, paths, &seen));
  GT_RETURN_IF_ERROR(CheckSameRun(results, paths));
  const pb::RunInfo& run0 = results[0].run;
  auto world = CheckWorld(run0, seen, dir, paths[0], paths);
  if (!world.ok()) return world.status();
  GT_RETURN_IF_ERROR(CheckGroupMembers(results, paths, *world));
  GT_RETURN_IF_ERROR(CheckParamIds(results, paths, run0.params_size()));

  TraceSet set;
  set.dir_ = dir;
  set.total_bytes_ = total;
  set.run0_ = run0;
  set.ranks_.resize(*world);
  set.groups_.resize(*world);
  for (auto& r : results) {
    int rank = r.run.rank();
    set.ranks_[rank] = r.file;
    set.groups_[rank] = std::move(r.groups);
    for (auto& f : r.frames) set.frames_.push_back(std::move(f));
    for (auto& s : r.steps) set.steps_.push_back(std::move(s));
  }
  std::sort(set.frames_.begin(), set.frames_.end(), [](const FrameRef& x, const FrameRef& y) {
    return std::tie(x.rank, x.offset) < std::tie(y.rank, y.offset);
  });
  set.InferGas();
  set.FoldPrecision();
  auto table = std::make_shared<pb::RunInfo>();
  *table->mutable_params() = set.run0_.params();
  table->set_model_fingerprint(set.run0_.model_fingerprint());
  set.table_ = std::move(table);
  return set;
}

// The run's communication precision is the coarsest a parameter records
// (ParamInfo.comm_dtype, format 1.4) when the Config states none.
// The gradients' own precision is the coarsest a parameter's gradient or
// accumulation dtype records, when coarser than Config.dtype (a bf16 .grad of
// fp32 parameters): the tolerance then follows it, and the inference is said.
void TraceSet::FoldPrecision() {
  auto coarsest = [this](auto dtype_of) {
    pb::DType coarse = pb::DTYPE_UNSPECIFIED;
    for (const pb::ParamInfo& p : run0_.params()) {
      const pb::DType d = dtype_of(p);
      if (d != pb::DTYPE_UNSPECIFIED && (coarse == pb::DTYPE_UNSPECIFIED || UnitRoundoff(d) > UnitRoundoff(coarse))) {
        coarse = d;
      }
    }
    return coarse;
  };
  pb::Config* c = run0_.mutable_config();
  const pb::DType comm = coarsest([](const pb::ParamInfo& p) { return p.comm_dtype(); });
  if (c->comm_dtype() == pb::DTYPE_UNSPECIFIED && comm != pb::DTYPE_UNSPECIFIED) c->set_comm_dtype(comm);
  const pb::DType grad = coarsest([](const pb::ParamInfo& p) { return p.grad_dtype(); });
  const pb::DType accum = coarsest([](const pb::ParamInfo& p) { return p.accum_dtype(); });
  for (const pb::DType d : {grad, accum}) {
    if (d == pb::DTYPE_UNSPECIFIED || UnitRoundoff(d) <= UnitRoundoff(c->dtype())) continue;
    inferences_.push_back(std::string("gradients ") + (d == grad ? "computed" : "accumulated") + " in " + DTypeName(d) +
                          " (ParamInfo." + (d == grad ? "grad_dtype" : "accum_dtype") + ") while Config.dtype is " +
                          DTypeName(c->dtype()) + ": judged with " + DTypeName(d) + "'s rounding");
    c->set_dtype(d);
  }
}

// A producer that did not record gas (0 or 1) while every optimizer step of
// the trace counts the same K > 1 micro-steps (the optimizer-step StepInfo and
// FINAL carry the last micro-step's index): gas is K. Explanations and the
// tolerance then see it like a recorded one, and the inference is said.
void TraceSet::InferGas() {
  if (run0_.config().gas() > 1) return;
  std::map<int64_t, int32_t> last_micro;  // per step: the largest micro-step index seen
  for (const RankStep& s : steps_) {
    if (s.info.optimizer_step()) last_micro[s.info.step()] = std::max(last_micro[s.info.step()], s.info.micro_step());
  }
  for (const FrameRef& f : frames_) {
    if (f.phase == pb::FINAL) last_micro[f.step] = std::max(last_micro[f.step], f.micro_step);
  }
  if (last_micro.empty()) return;
  const int32_t k = last_micro.begin()->second + 1;
  if (k <= 1 || k > (1 << 20)) return;
  for (const auto& [step, micro] : last_micro) {
    if (micro + 1 != k) return;  // steps disagree: nothing to infer
  }
  // A pipeline's micro-steps are its micro-batches: gas x pp_microbatches of them per step (FORMAT.md 4.1).
  const int32_t n = std::max(run0_.config().pp_microbatches(), 1);
  if (k % n != 0 || k / n <= 1) return;
  const int recorded = run0_.config().gas();
  run0_.mutable_config()->set_gas(k / n);
  inferences_.push_back("gas " + std::to_string(k / n) + " inferred from the " + std::to_string(k) +
                        " micro-steps recorded in each of " + std::to_string(last_micro.size()) + " optimizer steps" +
                        (n > 1 ? " (" + std::to_string(n) + " pipeline micro-batches each)" : "") +
                        " (the trace records gas " + std::to_string(recorded) + ")");
}

}  // namespace gradtrace::diff
