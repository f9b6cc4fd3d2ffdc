// gradtrace-inspect PATH... [--verify] [--frames]
// Summarises trace files (or trace-set directories of rank-NNNNN.gtrace): run
// info, parameter table, steps, buckets per (step, micro, phase), bytes and
// compression ratio. Exit 0 when every file reads cleanly; a bad file prints
// one line "gradtrace-inspect: <path>: offset N: <what>" on stderr and the exit
// code is 2 (after the other files are inspected).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "archive.h"
#include "load/trace_set.h"
#include "rank_file.h"
#include "slice_codec.h"
#include "text_escape.h"
#include "trace_reader.h"

namespace gradtrace {
namespace {

namespace fs = std::filesystem;

const char* PhaseName(int phase) {
  switch (phase) {
    case pb::PRE_REDUCE:
      return "PRE_REDUCE";
    case pb::POST_REDUCE:
      return "POST_REDUCE";
    case pb::FINAL:
      return "FINAL";
    default:
      return "UNSPECIFIED";
  }
}

std::string Shape(const pb::ParamInfo& p) {
  std::string s = "[";
  for (int i = 0; i < p.shape_size(); ++i) s += (i ? ", " : "") + std::to_string(p.shape(i));
  return s + "]";
}

std::string Bytes(uint64_t n) {
  char buf[64];
  if (n < 10 * 1024) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
  } else if (n < 10ull * 1024 * 1024) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", n / 1024.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f MiB", n / (1024.0 * 1024.0));
  }
  return buf;
}

// "dense over sdp", "tp_shard dim 0 / 2 over dp", or "-" before format 1.2.
std::string Reduction(const pb::ParamInfo& p) {
  if (p.kind() == pb::PARAM_KIND_UNSPECIFIED && p.grad_group().empty()) return "-";
  std::string kind = pb::ParamKind_Name(p.kind());
  for (char& c : kind) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (p.has_partition_dim()) kind += " dim " + std::to_string(p.partition_dim());
  if (p.shard_count() > 0) kind += " / " + std::to_string(p.shard_count());
  if (!p.grad_group().empty()) kind += " over " + p.grad_group();
  // 1.5: the pipeline stage holding it ("stages 0,3 tied": a copy on each)
  for (int i = 0; i < p.stages_size(); ++i) {
    kind += (i == 0 ? (p.stages_size() > 1 ? ", stages " : ", stage ") : ",") + std::to_string(p.stages(i));
  }
  return p.stages_size() > 1 ? kind + " tied" : kind;
}

std::string Fixed(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

// Every string from a trace or a path is printed through T: regression, issue 20 (terminal escape sequences in
// names and the producer went to the terminal as they were).
std::string T(const std::string& s) { return TerminalSafe(s); }

void PrintRunInfo(const TraceReader& r) {
  const pb::RunInfo& run = r.run_info();
  std::printf("== %s\n", T(r.path()).c_str());
  std::printf("producer     %s %s\n", T(run.producer()).c_str(), T(run.producer_version()).c_str());
  std::printf("run id       %s\n", T(run.run_id()).c_str());
  std::printf("rank         %d (dp_rank %d, sp_rank %d) on %s\n", run.rank(), run.dp_rank(), run.sp_rank(),
              T(run.host()).c_str());
  if (!run.framework().empty())
    std::printf("framework    %s %s\n", T(run.framework()).c_str(), T(run.framework_version()).c_str());
  if (!run.versions().empty()) {
    std::map<std::string, std::string> sorted(run.versions().begin(), run.versions().end());
    std::string line;
    for (const auto& [component, version] : sorted) line += (line.empty() ? "" : ", ") + component + " " + version;
    std::printf("versions     %s\n", T(line).c_str());
  }
  std::printf("config       %s\n", T(run.config().ShortDebugString()).c_str());
  // What the producer inferred rather than was told (an adapter's layout: expert parameters by name, ...).
  if (auto it = run.extra().find("inferred"); it != run.extra().end()) {
    std::printf("inferred     %s\n", T(it->second).c_str());  // one line, no escapes
  }
  // A group of a cluster lists thousands of ranks: the first and last few, and how many (issue 42).
  constexpr int kShownRanks = 16;
  for (const pb::ProcessGroup& g : run.groups()) {
    std::string ranks;
    const int n = g.ranks_size();
    for (int i = 0; i < n; ++i) {
      if (n > kShownRanks && i == kShownRanks / 2) {
        ranks += ", ...";
        i = n - kShownRanks / 2;
      }
      ranks += (i ? ", " : "") + std::to_string(g.ranks(i));
    }
    std::printf("group        %-6s [%s]%s\n", T(g.name()).c_str(), ranks.c_str(),
                n > kShownRanks ? (" (" + std::to_string(n) + " ranks)").c_str() : "");
  }
  std::printf("fingerprint  %s%s\n", T(run.model_fingerprint()).c_str(),
              run.model_fingerprint() == ModelFingerprint(run) ? "" : "  (does not match the parameter table!)");
  std::printf("index        %s\n", r.has_index() ? "yes" : "no (scanned)");
  std::printf("params       %d\n", run.params_size());
  std::printf("  %5s  %-48s %-20s %-5s %12s  %s\n", "id", "name", "shape", "dtype", "numel", "reduced");
  for (const pb::ParamInfo& p : run.params()) {
    std::printf("  %5d  %-48s %-20s %-5s %12lld  %s\n", p.id(), T(p.name()).c_str(), Shape(p).c_str(),
                DTypeName(p.dtype()), static_cast<long long>(p.numel()), T(Reduction(p)).c_str());
  }
  // Format 1.4: what tells a setup difference and compressed communication apart.
  int sketched = 0, compressed = 0;
  for (const pb::ParamInfo& p : run.params()) {
    sketched += p.init_sketch_size() > 0;
    compressed += p.comm_dtype() != pb::DTYPE_UNSPECIFIED && p.comm_dtype() != p.dtype();
  }
  std::printf("init values  sketched for %d of %d parameters\n", sketched, run.params_size());
  if (run.config().comm_dtype() != pb::DTYPE_UNSPECIFIED || compressed > 0) {
    std::printf("comm         %s%s%s (%d parameters communicated in another dtype)\n",
                DTypeName(run.config().comm_dtype()), run.config().comm_hook().empty() ? "" : " via ",
                T(run.config().comm_hook()).c_str(), compressed);
  }
}

struct BucketTally {
  int frames = 0;
  int slices = 0;
  int64_t elements = 0;
  uint64_t stored = 0;
  uint64_t raw = 0;
};
// Per (step, micro-step, phase).
using BucketTallies = std::map<std::tuple<int64_t, int32_t, int>, BucketTally>;

void Tally(const Frame& f, BucketTallies* buckets) {
  BucketTally& t = (*buckets)[{f.bucket->step(), f.bucket->micro_step(), f.bucket->phase()}];
  ++t.frames;
  t.slices += f.bucket->slices_size();
  for (const pb::Slice& s : f.bucket->slices()) t.elements += s.count();
  t.stored += f.stored_len;
  t.raw += f.raw_len;
}

// One line of --frames.
void PrintFrame(const Frame& f) {
  std::string what;
  const char* type = "unknown";
  if (f.step) {
    type = "step";
    what = "step " + std::to_string(f.step->step()) + " micro " + std::to_string(f.step->micro_step());
  } else if (f.bucket) {
    type = "bucket";
    what = "step " + std::to_string(f.bucket->step()) + " micro " + std::to_string(f.bucket->micro_step()) +
           " bucket " + std::to_string(f.bucket->bucket_id()) + " " + PhaseName(f.bucket->phase()) + " slices " +
           std::to_string(f.bucket->slices_size());
    if (f.bucket->chunk_count() > 1) {
      what += " chunk " + std::to_string(f.bucket->chunk() + 1) + "/" + std::to_string(f.bucket->chunk_count());
    }
    // Format 1.6: the values are those of an earlier frame (FORMAT.md 4.3).
    if (f.bucket->values_from() != 0) what += " values of " + std::to_string(f.bucket->values_from());
  }
  std::printf("  %10llu %-8s %10u %10u  %s\n", static_cast<unsigned long long>(f.offset), type, f.stored_len, f.raw_len,
              what.c_str());
}

// The micro-steps each optimizer step ran (its optimizer-step StepInfo carries the last one's index):
// gradtrace-diff takes them as gas when the config records none (diff/load/trace_set.cc, InferGas).
void PrintInferredGas(const pb::RunInfo& run, const std::vector<pb::StepInfo>& steps, const BucketTallies& buckets) {
  std::map<int64_t, int32_t> last_micro;  // per step, from the optimizer-step StepInfo and FINAL records
  for (const pb::StepInfo& s : steps) {
    if (s.optimizer_step()) last_micro[s.step()] = std::max(last_micro[s.step()], s.micro_step());
  }
  for (const auto& [key, tally] : buckets) {
    if (std::get<2>(key) == pb::FINAL)
      last_micro[std::get<0>(key)] = std::max(last_micro[std::get<0>(key)], std::get<1>(key));
  }
  std::set<int32_t> micro_counts;
  for (const auto& [step, micro] : last_micro) micro_counts.insert(micro + 1);
  if (micro_counts.size() == 1 && *micro_counts.begin() > 1 && run.config().gas() <= 1) {
    std::printf(
        "gas          %d micro-steps in every optimizer step, Config.gas records %d: gradtrace-diff infers "
        "gas %d\n",
        *micro_counts.begin(), run.config().gas(), *micro_counts.begin());
  }
}

void PrintSteps(const std::vector<pb::StepInfo>& steps) {
  if (!steps.empty())
    std::printf("  %6s %5s %14s %12s %12s %14s\n", "step", "micro", "loss", "valid_tokens", "lr", "grad_norm");
  for (const pb::StepInfo& s : steps) {
    const std::string norm = s.has_reported_grad_norm() ? Fixed(s.reported_grad_norm()) : "-";
    if (s.optimizer_step()) {
      std::printf("  %6lld %5s %14s %12s %12.6g %14s", static_cast<long long>(s.step()), "opt", "-", "-", s.lr(),
                  norm.c_str());
      if (s.input_count() > 0) {
        const double n = static_cast<double>(s.input_count());
        std::printf("  inputs %lld, mean %.6g, mean square %.6g", static_cast<long long>(s.input_count()),
                    s.input_sum() / n, s.input_sumsq() / n);
      }
      std::printf("\n");
      continue;
    }
    std::printf("  %6lld %5d %14.8g %12lld %12.6g %14s\n", static_cast<long long>(s.step()), s.micro_step(), s.loss(),
                static_cast<long long>(s.valid_tokens()), s.lr(), norm.c_str());
  }
}

// Issue 26: a Trainer run under ZeRO wrote losses and grad norms but no gradient, and nothing said so. The
// adapter's warning went to the run's stderr; the trace itself shows it as step records without bucket records.
void PrintNoGradients(const std::vector<pb::StepInfo>& steps, const BucketTallies& buckets) {
  if (steps.empty() || !buckets.empty()) return;
  std::printf(
      "gradients    NONE: %zu step records but no PRE_REDUCE, POST_REDUCE or FINAL record: the capture saw no "
      "gradient (its warning on the run's stderr says why)\n",
      steps.size());
}

void PrintBuckets(const BucketTallies& buckets) {
  std::printf("buckets\n  %6s %5s %-12s %7s %7s %12s %10s %10s\n", "step", "micro", "phase", "frames", "slices",
              "elements", "stored", "raw");
  for (const auto& [key, t] : buckets) {
    std::printf("  %6lld %5d %-12s %7d %7d %12lld %10s %10s\n", static_cast<long long>(std::get<0>(key)),
                std::get<1>(key), PhaseName(std::get<2>(key)), t.frames, t.slices, static_cast<long long>(t.elements),
                Bytes(t.stored).c_str(), Bytes(t.raw).c_str());
  }
}

// Returns the reader's final status.
Status InspectFile(const TraceSource& source, bool frames) {
  Expected<std::unique_ptr<TraceReader>> opened = TraceReader::Open(source);
  if (!opened.ok()) return opened.status();
  TraceReader& r = **opened;
  PrintRunInfo(r);
  std::vector<pb::StepInfo> steps;
  BucketTallies buckets;
  int count = 0;
  Frame f;
  if (frames) std::printf("frames\n  %10s %-8s %10s %10s  %s\n", "offset", "type", "stored", "raw", "contents");
  while (r.Next(&f)) {
    ++count;
    if (f.step) steps.push_back(*f.step);
    if (f.bucket) Tally(f, &buckets);
    if (frames) PrintFrame(f);
  }
  std::printf("steps        %zu\n", steps.size());
  PrintInferredGas(r.run_info(), steps, buckets);
  PrintSteps(steps);
  PrintNoGradients(steps, buckets);
  PrintBuckets(buckets);
  const double ratio = r.stored_bytes() ? static_cast<double>(r.raw_bytes()) / r.stored_bytes() : 0.0;
  std::printf("totals       %d frames; %s on disk; payload %s stored, %s raw; compression ratio %.3f\n", count,
              Bytes(r.file_size()).c_str(), Bytes(r.stored_bytes()).c_str(), Bytes(r.raw_bytes()).c_str(), ratio);
  return r.status();
}

// The trace files of `arg` (path order): a file; a trace-set directory; a
// bug-report archive (every SET/rank-NNNNN.gtrace member), "ARCHIVE:SET" (one
// set's) or "ARCHIVE:MEMBER" (one member), read in place.
std::vector<TraceSource> Expand(const std::string& arg, Status* error) {
  const size_t colon = arg.rfind(':');
  std::string archive_path = arg, pick;
  if (!LooksLikeArchive(arg) && colon != std::string::npos && LooksLikeArchive(arg.substr(0, colon))) {
    archive_path = arg.substr(0, colon);
    pick = arg.substr(colon + 1);
  }
  std::vector<TraceSource> out;
  if (LooksLikeArchive(archive_path)) {
    auto archive = Archive::Open(archive_path);
    if (!archive.ok()) {
      *error = archive.status();
      return out;
    }
    for (const ArchiveMember& m : archive->members()) {
      // A trace member: SET/rank-NNNNN.gtrace, one rule with the diff (rank_file.h); a misnamed one among
      // those asked for is reported.
      const size_t slash = m.name.find('/');
      const bool asked = pick.empty() || m.name == pick || m.name.rfind(pick + "/", 0) == 0;
      bool trace = false;
      if (slash != std::string::npos && m.name.find('/', slash + 1) == std::string::npos) {
        auto rank = RankFileMember(archive->NameOf(m));
        if (!rank.ok() && asked && error->ok()) *error = rank.status();
        trace = rank.ok() && rank->has_value();
      }
      const bool picked = pick.empty() ? trace : m.name == pick || (trace && m.name.rfind(pick + "/", 0) == 0);
      if (picked) out.push_back(TraceSource::Window(archive_path, m.offset, m.size, archive->NameOf(m)));
    }
    if (out.empty()) *error = Status::InvalidArgument(arg + ": no such trace member in the archive");
    return out;
  }
  std::error_code ec;
  if (!fs::is_directory(arg, ec)) return {TraceSource::File(arg)};
  for (const auto& e : fs::directory_iterator(arg, ec)) {
    // The diff's rule (rank_file.h): a misnamed rank-*.gtrace is reported, the rest of the set still shown.
    auto rank = RankFileMember(e.path().string());
    if (!rank.ok() && error->ok()) *error = rank.status();
    if (rank.ok() && rank->has_value()) out.push_back(TraceSource::File(e.path().string()));
  }
  if (ec) *error = Status::IoError(arg + ": cannot list directory: " + ec.message());
  if (out.empty() && error->ok()) {
    *error = Status::InvalidArgument(arg + ": no " + kRankFilePattern + " files in this directory");
  }
  std::sort(out.begin(), out.end(), [](const TraceSource& x, const TraceSource& y) { return x.path < y.path; });
  return out;
}

// Whether `arg` names a trace set (a directory, an archive, ARCHIVE:SET) rather than one file or member.
bool NamesASet(const std::string& arg) {
  std::error_code ec;
  if (fs::is_directory(arg, ec) || LooksLikeArchive(arg)) return true;
  const size_t colon = arg.rfind(':');
  return colon != std::string::npos && LooksLikeArchive(arg.substr(0, colon)) &&
         arg.find('/', colon + 1) == std::string::npos;
}

// --verify of a set: its ranks checked against each other as the diff checks them (one loader,
// diff/load/trace_set.h): a rank file per rank of the world, no rank twice, the rank each RunInfo claims its
// file's, one run id, configuration and parameter table. Sources are grouped by their set (an archive holds
// two); errors name the file.
Status VerifySets(const std::vector<TraceSource>& sources) {
  std::map<std::string, std::vector<TraceSource>> sets;
  for (const TraceSource& s : sources) {
    const std::string name = s.display();
    sets[name.substr(0, name.rfind('/'))].push_back(s);
  }
  for (auto& [name, members] : sets) {
    const size_t n = members.size();
    auto set = diff::TraceSet::LoadSources(name, std::move(members));
    if (!set.ok()) return set.status();
    std::printf("set          ok: %s: %zu rank%s of run '%s', one configuration and parameter table\n", T(name).c_str(),
                n, n == 1 ? "" : "s", T(set->run().run_id()).c_str());
  }
  return Status::Ok();
}

int Main(int argc, char** argv) {
  CLI::App app{"Summarise and verify gradtrace trace files (.gtrace) or trace-set directories."};
  std::vector<std::string> paths;
  bool verify = false;
  bool frames = false;
  app.add_option("PATH", paths,
                 "trace file, directory holding rank-NNNNN.gtrace, or bug-report archive (ARCHIVE, ARCHIVE:SET, "
                 "ARCHIVE:MEMBER)")
      ->required();
  app.add_flag("--verify", verify, "check every frame's CRC, the index and the footer; report truncation");
  app.add_flag("--frames", frames, "list every frame with its offset and sizes");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;  // usage errors share diff(1)'s "trouble" code
  }
  int rc = 0;
  auto fail = [&rc](const Status& s) {
    std::fprintf(stderr, "gradtrace-inspect: %s\n", T(s.message()).c_str());
    rc = 2;
  };
  for (const std::string& arg : paths) {
    Status listed;
    const std::vector<TraceSource> sources = Expand(arg, &listed);
    bool all_ok = listed.ok();
    for (const TraceSource& source : sources) {
      std::fflush(stdout);
      Status s = InspectFile(source, frames);
      if (s.ok() && verify) {
        s = VerifyFile(source);
        if (s.ok()) std::printf("verify       ok: every frame checksum, the index and the footer are valid\n");
      }
      std::fflush(stdout);
      if (!s.ok()) fail(s), all_ok = false;
    }
    if (!listed.ok()) fail(listed);
    // Each file is sound: now the set as a whole, as the diff would load it.
    if (verify && all_ok && !sources.empty() && NamesASet(arg)) {
      if (Status s = VerifySets(sources); !s.ok()) fail(s);
      std::fflush(stdout);
    }
  }
  return rc;
}

}  // namespace
}  // namespace gradtrace

int main(int argc, char** argv) { return gradtrace::Main(argc, argv); }
