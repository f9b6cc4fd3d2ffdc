#include "packer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include "compare/diff_engine.h"
#include "compare/step_table.h"
#include "environment.h"
#include "evidence/evidence.h"
#include "evidence/self_check.h"
#include "fidelity.h"
#include "load/progress.h"
#include "rank_file.h"
#include "readme.h"
#include "reencode.h"
#include "report_member.h"
#include "signal_cleanup.h"
#include "stale_temporaries.h"
#include "tar_writer.h"
#include "text_escape.h"

namespace gradtrace::pack {
namespace fs = std::filesystem;
namespace {

constexpr int kMaxAttempts = 6;
// A re-encoded archive below this fraction of the limit is planned again with
// the room left (the size estimates are deliberately pessimistic).
constexpr double kGoodFill = 0.9;

// Progress on stderr; the sets' paths in it with their control bytes escaped (text_escape.h).
void Say(const std::string& line) { std::fprintf(stderr, "gradtrace-pack: %s\n", TerminalSafe(line).c_str()); }

// One trace member to pack: its name in the archive and where its bytes are.
struct TraceMember {
  std::string set;  // "a" or "b"
  std::string name;
  TraceSource source;
};

// Removes a file or directory tree when it goes out of scope, or when SIGINT, SIGTERM or SIGHUP ends the
// process first (temporaries; signal_cleanup.h).
struct Cleanup {
  explicit Cleanup(std::string p) : path(std::move(p)) { RemoveOnSignal(path); }
  Cleanup(const Cleanup&) = delete;
  Cleanup& operator=(const Cleanup&) = delete;
  ~Cleanup() {
    std::error_code ec;
    fs::remove_all(path, ec);
    ForgetOnSignal(path);  // after the removal: a signal between the two finds nothing to remove
  }
  std::string path;
};

// The temporaries beside the output, removed however Pack ends: the archive being written, the last one
// that fit, and the re-encoded traces.
struct Temporaries {
  explicit Temporaries(const std::string& out)
      : tmp(Named(out, kTemporaryKinds[0])),
        best(Named(out, kTemporaryKinds[1])),
        work(Named(out, kTemporaryKinds[2])) {}
  // OUT.KIND.PID: the next run removes it if this process dies without its handlers (stale_temporaries.h).
  static std::string Named(const std::string& out, const char* kind) {
    return out + "." + kind + "." + std::to_string(::getpid());
  }
  Cleanup tmp, best, work;
};

diff::LoadOptions LoadOptionsWithThreads(int threads) {
  diff::LoadOptions o;
  o.threads = threads;
  return o;
}

std::string SetName(size_t i) { return i == 0 ? diff::kPackSetA : diff::kPackSetB; }

std::vector<TraceMember> CapturedMembers(const std::vector<diff::TraceSet>& sets) {
  std::vector<TraceMember> out;
  for (size_t i = 0; i < sets.size(); ++i) {
    for (const diff::RankFile& f : sets[i].ranks()) {
      out.push_back({SetName(i), SetName(i) + "/" + RankFileName(f.rank), f.source});
    }
  }
  return out;
}

Expected<diff::Report> RunComparison(const std::vector<const diff::TraceSet*>& sets, const diff::PackedDiff& d,
                                     int threads) {
  if (d.mode == "self") {
    diff::SelfOptions o;
    o.step = d.step;
    o.rtol = d.rtol;
    o.threads = threads;
    return diff::SelfCheckSteps(*sets[0], o);
  }
  diff::DiffOptions o;
  o.phase = d.phase == "pre" ? pb::PRE_REDUCE : d.phase == "post" ? pb::POST_REDUCE : pb::FINAL;
  o.step = d.step;
  o.rtol = d.rtol;
  o.renames = d.renames;
  o.threads = threads;
  return diff::DiffSteps(*sets[0], *sets[1], o);
}

// The report as `gradtrace-diff ARCHIVE --html` draws it: a diff's HTML shows each side's bucket view
// (DiffOptions.bucket_view), while report.json stays the plain diff's, which a rerun without --html repeats.
diff::Report WithBucketViews(diff::Report r, const std::vector<const diff::TraceSet*>& sets, const PackOptions& o) {
  if (r.mode != "diff") return r;
  r.a.bucket_view = diff::SideBucketView(*sets[0], r.step, o.diff.rtol, o.threads);
  r.b.bucket_view = diff::SideBucketView(*sets[1], r.step, o.diff.rtol, o.threads);
  return r;
}

// What the plan needs from the captured diff: parameters that differ first
// (worst first, as the report lists them), and a word for why.
void Priorities(const diff::Report& r, std::vector<std::string>* order, std::map<std::string, std::string>* differs) {
  for (int pass = 0; pass < 2; ++pass) {
    for (const diff::ParamResult& p : r.params) {
      const bool bad = p.verdict != diff::Verdict::kMatch;
      if (bad == (pass == 0)) order->push_back(p.name);
      if (bad && pass == 0) (*differs)[p.name] = diff::VerdictName(p.verdict);
    }
    for (const diff::SelfParam& p : r.self_params) {
      const bool bad = p.verdict != diff::SelfVerdict::kOk;
      if (bad == (pass == 0)) order->push_back(p.name);
      if (bad && pass == 0) (*differs)[p.name] = diff::SelfVerdictName(p.verdict);
    }
  }
}

std::string Options(const diff::PackedDiff& d) {
  std::string s;
  if (d.phase != "final") s += " --phase " + d.phase;
  if (d.step) s += " --step " + std::to_string(*d.step);
  if (d.rtol) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", *d.rtol);
    s += std::string(" --rtol ") + buf;
  }
  for (const std::string& r : d.renames) s += " --rename '" + r + "'";
  return s.empty() ? s : s.substr(1);
}

struct Attempt {
  std::vector<TraceMember> traces;
  std::vector<Choice> fidelity;  // empty: as captured
  std::optional<diff::Report> original;
};

struct Written {
  uint64_t size = 0;
  uint64_t trace_bytes = 0;
  size_t members = 0;
  diff::Report report;
};

// The packed trace members of each set, as windows of the archive being written.
using PackedSets = std::map<std::string, std::vector<TraceSource>>;

// Copies the traces into the archive, flushed so that they can be read back from `tmp`. `name`: the
// archive's file name, which names the members. *bytes: what was copied.
Status CopyTraces(const std::vector<TraceMember>& traces, const std::string& tmp, const std::string& name, TarWriter* w,
                  PackedSets* packed, uint64_t* bytes) {
  uint64_t total = 0, done = 0;
  for (const TraceMember& m : traces) total += m.source.size.value_or(fs::file_size(m.source.path));
  diff::Progress bar("gradtrace-pack: copying traces", diff::Progress::Wanted(total));
  for (const TraceMember& m : traces) {
    GT_RETURN_IF_ERROR(w->AddCopy(m.name, m.source, [&](uint64_t n) { bar.Update(done += n, total); }));
    const ArchiveMember& am = w->members().back();
    (*packed)[m.set].push_back(TraceSource::Window(tmp, am.offset, am.size, name + ":" + am.name));
  }
  bar.Finish();
  *bytes = done;
  return w->Flush();
}

// A report's JSON, compressed when large (report_member.h).
Status AddJson(TarWriter* w, const std::string& name, std::string json) {
  auto member = ReportJsonMember(name, std::move(json));
  if (!member.ok()) return member.status();
  return w->Add(member->name, member->bytes);
}

// The report comes from the packed members, named as the archive will be,
// so `gradtrace-diff ARCHIVE` reproduces it byte for byte. Adds it in its three
// renderings (and the captured traces' report, when re-encoded).
Expected<diff::Report> AddReports(const PackOptions& options, const std::string& name, const PackedSets& packed,
                                  const Attempt& attempt, TarWriter* w) {
  std::vector<diff::TraceSet> sets;
  for (const auto& [set, sources] : packed) {
    auto s = diff::TraceSet::LoadSources(name + ":" + set, sources, LoadOptionsWithThreads(options.threads));
    if (!s.ok()) return s.status();
    sets.push_back(std::move(*s));
  }
  std::vector<const diff::TraceSet*> ptrs;
  for (const auto& s : sets) ptrs.push_back(&s);
  auto report = RunComparison(ptrs, options.diff, options.threads);
  if (!report.ok()) return report.status();
  GT_RETURN_IF_ERROR(AddJson(w, "report.json", diff::RenderJson(*report)));
  GT_RETURN_IF_ERROR(w->Add("report.md", diff::RenderMarkdown(*report)));
  GT_RETURN_IF_ERROR(w->Add("report.html", diff::RenderHtml(WithBucketViews(*report, ptrs, options))));
  if (attempt.original) GT_RETURN_IF_ERROR(AddJson(w, "original-report.json", diff::RenderJson(*attempt.original)));
  return report;
}

diff::Json Manifest(const PackOptions& options, const Attempt& attempt, uint64_t captured_bytes,
                    uint64_t packed_bytes) {
  diff::Json manifest = diff::Json::object();
  manifest["format"] = diff::kPackFormat;
  manifest["diff"] = diff::PackedDiffToJson(options.diff);
  manifest["sets"] = diff::Json::object();
  for (size_t i = 0; i < options.sets.size(); ++i) manifest["sets"][SetName(i)] = options.sets[i];
  manifest["limit_bytes"] = options.limit;
  manifest["captured_trace_bytes"] = captured_bytes;
  manifest["packed_trace_bytes"] = packed_bytes;
  manifest["reencoded"] = !attempt.fidelity.empty();
  manifest["fidelity"] = diff::Json::array();
  for (const Choice& c : attempt.fidelity) {
    manifest["fidelity"].push_back({{"param", c.name}, {"kept", c.mode.ToString()}, {"why", c.why}});
  }
  return manifest;
}

// The attachments under attached/, then the README that lists them.
Status AddAttachmentsAndReadme(const PackOptions& options, const Attempt& attempt, const diff::Report& report,
                               uint64_t captured_bytes, uint64_t packed_bytes, TarWriter* w) {
  ReadmeFacts facts;
  facts.archive = fs::path(options.output).filename().string();
  facts.sources = options.sets;
  facts.mode = options.diff.mode;
  facts.diff_options = Options(options.diff);
  facts.headline = diff::Headline(report);
  facts.exit_code = report.ExitCode();
  facts.captured_bytes = captured_bytes;
  facts.packed_trace_bytes = packed_bytes;
  facts.limit = options.limit;
  facts.fidelity = attempt.fidelity;
  facts.original_report = attempt.original.has_value();
  for (const ArchiveMember& m : w->members())
    facts.compressed_json = facts.compressed_json || m.name == "report.json.zst";
  for (const std::string& a : options.attachments) {
    const std::string base = fs::path(a).filename().string();
    GT_RETURN_IF_ERROR(w->AddCopy("attached/" + base, TraceSource::File(a), nullptr));
    facts.attachments.push_back(base);
  }
  return w->Add("README.md", RenderReadme(facts));
}

// Writes the whole archive to `tmp`; messages name options.output.
Expected<Written> WriteArchive(const PackOptions& options, const std::string& tmp, const Attempt& attempt,
                               uint64_t captured_bytes, const std::vector<diff::TraceSet>& captured) {
  const std::string& out = options.output;
  auto tar = TarWriter::Create(tmp, out, static_cast<int64_t>(std::time(nullptr)));
  if (!tar.ok()) return tar.status();
  TarWriter& w = **tar;
  // Members are named by the archive's file name, as the README's rerun
  // command (`gradtrace-diff bug.gtpack`, run where the file is) names them.
  const std::string name = fs::path(out).filename().string();
  Written result;
  PackedSets packed;  // set -> its members, read back from `tmp`
  GT_RETURN_IF_ERROR(CopyTraces(attempt.traces, tmp, name, &w, &packed, &result.trace_bytes));

  Say("comparing the packed traces (" + HumanBytes(static_cast<double>(result.trace_bytes)) + ")");
  auto report = AddReports(options, name, packed, attempt, &w);
  if (!report.ok()) return report.status();

  std::vector<PackedSet> env_sets;
  for (size_t i = 0; i < captured.size(); ++i) env_sets.push_back({SetName(i), options.sets[i], &captured[i]});
  GT_RETURN_IF_ERROR(
      w.Add("environment.json", diff::DumpJson(EnvironmentJson(env_sets, options.argv, std::time(nullptr)))));
  GT_RETURN_IF_ERROR(
      w.Add(diff::kPackManifest, diff::DumpJson(Manifest(options, attempt, captured_bytes, result.trace_bytes))));
  GT_RETURN_IF_ERROR(AddAttachmentsAndReadme(options, attempt, *report, captured_bytes, result.trace_bytes, &w));
  GT_RETURN_IF_ERROR(w.Finish());
  result.size = w.size();
  result.members = w.members().size();
  result.report = std::move(*report);
  return result;
}

// The archive without its traces, estimated from the captured diff's report
// (the packed one is about as large): reports (the JSON as stored, twice: the
// packed and the original), environment, manifest (a fidelity entry per
// parameter), README (at most kReadmeFidelityRows of them), attachments, headers.
double RestOfArchive(const diff::Report& r, const PackOptions& o, size_t params, size_t traces) {
  auto json = ReportJsonMember("report.json", diff::RenderJson(r));
  double bytes =
      2.0 * (json.ok() ? json->bytes.size() : 0) + diff::RenderMarkdown(r).size() + diff::RenderHtml(r).size();
  double names = 0;
  for (const auto& p : r.params) names += static_cast<double>(p.name.size());
  bytes += 16e3 + names + 80.0 * params + 200.0 * std::min<size_t>(params, kReadmeFidelityRows);
  for (const std::string& a : o.attachments) bytes += static_cast<double>(fs::file_size(a));
  bytes += 2.0 * kTarBlock * (traces + 8 + o.attachments.size()) + 2.0 * kTarBlock;
  return 1.05 * bytes;
}

// Re-encodes every captured trace into `dir` following `plan`.
Expected<std::vector<TraceMember>> Reencode(const std::vector<TraceMember>& captured, const std::vector<Choice>& plan,
                                            const std::string& dir) {
  std::unordered_map<std::string, CaptureMode> modes;
  for (const Choice& c : plan) modes.emplace(c.name, c.mode);
  std::vector<TraceMember> out;
  int kinds[3] = {0, 0, 0};
  for (const Choice& c : plan) ++kinds[static_cast<int>(c.mode.kind)];
  Say("re-encoding " + std::to_string(captured.size()) + " trace files; parameters: " + std::to_string(kinds[0]) +
      " full, " + std::to_string(kinds[1]) + " sketch, " + std::to_string(kinds[2]) + " stats");
  for (const TraceMember& m : captured) {
    const std::string path = (fs::path(dir) / m.name).string();
    std::error_code ec;
    fs::create_directories(fs::path(path).parent_path(), ec);
    if (ec) return Status::IoError(path + ": cannot create its directory: " + ec.message());
    auto n = ReencodeTrace(m.source, path, modes);
    if (!n.ok()) return n.status();
    out.push_back({m.set, m.name, TraceSource::File(path)});
  }
  return out;
}

// The output and attachments, checked before any work: errors name the file.
Status CheckPaths(const PackOptions& options) {
  const std::string& out = options.output;
  struct stat st;
  if (::stat(out.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(out + ": exists and is not a regular file");
  }
  std::set<std::string> attached;
  for (const std::string& a : options.attachments) {
    if (::stat(a.c_str(), &st) != 0) return Status::IoError(a + ": cannot attach: " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) return Status::InvalidArgument(a + ": cannot attach: not a regular file");
    const std::string base = fs::path(a).filename().string();
    if (base.size() > 90 || !BadMemberName(base).empty()) {
      return Status::InvalidArgument(a + ": cannot attach: file name too long or unusual for an archive member");
    }
    if (!attached.insert(base).second) {
      return Status::InvalidArgument(a + ": cannot attach: another attachment is also named " + base);
    }
  }
  return Status::Ok();
}

// The sets as captured, with a line each on stderr. The archive replaces the
// output only at the end, but never one of its inputs.
Expected<std::vector<diff::TraceSet>> LoadCaptured(const PackOptions& options) {
  std::vector<diff::TraceSet> captured;
  for (size_t i = 0; i < options.sets.size(); ++i) {
    auto s = diff::TraceSet::Load(options.sets[i], LoadOptionsWithThreads(options.threads));
    if (!s.ok()) return s.status();
    Say("set " + SetName(i) + ": " + options.sets[i] + ", " + std::to_string(s->world()) + " ranks, " +
        HumanBytes(static_cast<double>(s->total_bytes())));
    for (const diff::RankFile& f : s->ranks()) {
      std::error_code ec;
      if (fs::equivalent(f.source.path, options.output, ec)) {
        return Status::InvalidArgument(options.output + ": is one of the trace files to pack (" + f.path + ")");
      }
    }
    captured.push_back(std::move(*s));
  }
  return captured;
}

// The captured traces' diff, run the first time they do not fit: it says which parameters to keep best.
Expected<diff::Report> CompareCaptured(const PackOptions& options, const std::vector<diff::TraceSet>& captured,
                                       uint64_t captured_bytes) {
  Say("the traces (" + HumanBytes(static_cast<double>(captured_bytes)) + ") do not fit " +
      HumanBytes(static_cast<double>(options.limit)) + ": comparing them to choose what to keep");
  std::vector<const diff::TraceSet*> ptrs;
  for (const auto& s : captured) ptrs.push_back(&s);
  return RunComparison(ptrs, options.diff, options.threads);
}

// What each parameter costs in each mode, read from the captured traces once.
Status MeasureCaptured(const std::vector<diff::TraceSet>& captured, uint64_t captured_bytes,
                       std::optional<Costs>* costs) {
  std::vector<const diff::TraceSet*> ptrs;
  for (const auto& s : captured) ptrs.push_back(&s);
  diff::Progress bar("gradtrace-pack: measuring", diff::Progress::Wanted(captured_bytes));
  auto measured = MeasureCosts(ptrs, [&bar](uint64_t done, uint64_t total) { bar.Update(done, total); });
  bar.Finish();
  if (!measured.ok()) return measured.status();
  *costs = std::move(*measured);
  return Status::Ok();
}

// Plans the fidelity for `budget` and re-encodes the captured traces into `work` (emptied first) by it.
Status Replan(const PackOptions& options, const std::vector<diff::TraceSet>& captured, const Costs& costs,
              const std::vector<std::string>& priority, const std::map<std::string, std::string>& differs,
              double budget, const std::string& work, Attempt* attempt) {
  auto plan = PlanFidelity(costs, priority, differs, budget);
  if (!plan.ok()) {
    return Status::InvalidArgument(options.output + ": cannot fit under --limit " +
                                   HumanBytes(static_cast<double>(options.limit)) + ": " + plan.status().message() +
                                   " (reports, environment and README take about " +
                                   HumanBytes(static_cast<double>(options.limit) - budget) + ")");
  }
  std::error_code ec;
  fs::remove_all(work, ec);
  auto traces = Reencode(CapturedMembers(captured), *plan, work);
  if (!traces.ok()) return traces.status();
  attempt->traces = std::move(*traces);
  attempt->fidelity = std::move(*plan);
  return Status::Ok();
}

// Everything but the traces, guessed until an archive has been written:
// reports and README grow with the parameters.
double GuessedBudget(const PackOptions& options, size_t params, size_t traces) {
  // The reports as stored: the JSON about 17 bytes a parameter once compressed (report_member.h, twice when
  // re-encoded), the HTML and Markdown bounded (diff/report/rows.h); 3 kB a parameter overestimated a
  // 100,000-parameter report 30-fold and re-encoded traces that fit as captured (issue 42).
  double overhead = 64e3 + 600e3 + 40.0 * params + 2048.0 * traces;
  for (const std::string& a : options.attachments) overhead += fs::file_size(a) + 1024;
  return static_cast<double>(options.limit) - overhead;
}

// The last archive that fit, kept at `best_tmp` until it is renamed into place at the end.
struct Best {
  Written written;
  bool reencoded = false;
};

// Moves the archive just written at `tmp` to `best_tmp`, replacing the one that fit before.
Status KeepAsBest(const std::string& out, const std::string& tmp, const std::string& best_tmp,
                  std::optional<Best>* best, Written written, bool reencoded) {
  if (*best) std::remove(best_tmp.c_str());
  if (std::rename(tmp.c_str(), best_tmp.c_str()) != 0) {
    return Status::IoError(out + ": cannot rename " + tmp + ": " + std::strerror(errno));
  }
  *best = Best{std::move(written), reencoded};
  return Status::Ok();
}

// Renames the best archive into place as the output; `result` gains what it holds.
Expected<PackResult> Finish(const std::string& out, const std::string& best_tmp, const Best& best, PackResult result) {
  if (std::rename(best_tmp.c_str(), out.c_str()) != 0) {
    return Status::IoError(out + ": cannot rename into place: " + std::strerror(errno));
  }
  result.archive_bytes = best.written.size;
  result.packed_trace_bytes = best.written.trace_bytes;
  result.members = best.written.members;
  result.reencoded = best.reencoded;
  result.headline = diff::Headline(best.written.report);
  result.diff_exit = best.written.report.ExitCode();
  return result;
}

}  // namespace

Expected<PackResult> Pack(const PackOptions& options) {
  const std::string& out = options.output;
  GT_RETURN_IF_ERROR(CheckPaths(options));
  for (const std::string& path : RemoveStaleTemporaries(out)) Say("removed " + path + ", left by an interrupted run");
  auto loaded = LoadCaptured(options);
  if (!loaded.ok()) return loaded.status();
  const std::vector<diff::TraceSet>& captured = *loaded;
  PackResult result;
  for (const auto& s : captured) result.captured_bytes += s.total_bytes();

  const Temporaries temps(out);
  std::optional<Best> best;

  Attempt attempt;
  attempt.traces = CapturedMembers(captured);
  std::optional<Costs> costs;
  std::vector<std::string> priority;
  std::map<std::string, std::string> differs;
  const size_t params = captured[0].run().params_size();
  double budget = GuessedBudget(options, params, attempt.traces.size());
  bool try_captured = static_cast<double>(result.captured_bytes) <= budget;
  bool rest_measured = false;  // budget from a written archive rather than a guess
  const double limit = static_cast<double>(options.limit);
  for (int n = 1; n <= kMaxAttempts; ++n) {
    result.attempts = n;
    if (!try_captured && !costs) {
      auto original = CompareCaptured(options, captured, result.captured_bytes);
      if (!original.ok()) return original.status();
      Priorities(*original, &priority, &differs);
      if (!rest_measured) budget = limit - RestOfArchive(*original, options, params, attempt.traces.size());
      attempt.original = std::move(*original);
      GT_RETURN_IF_ERROR(MeasureCaptured(captured, result.captured_bytes, &costs));
    }
    if (!try_captured)
      GT_RETURN_IF_ERROR(Replan(options, captured, *costs, priority, differs, budget, temps.work.path, &attempt));
    auto written = WriteArchive(options, temps.tmp.path, attempt, result.captured_bytes, captured);
    if (!written.ok()) return written.status();
    rest_measured = true;
    Say("attempt " + std::to_string(n) + ": " + HumanBytes(static_cast<double>(written->size)) + " (limit " +
        HumanBytes(limit) + ")");
    const double size = static_cast<double>(written->size);
    if (written->size <= options.limit) {
      // A re-encoded archive well under the limit was planned on pessimistic
      // estimates: keep it, and try once more with the room left.
      const bool roomy = !try_captured && size < kGoodFill * limit && n < kMaxAttempts;
      GT_RETURN_IF_ERROR(
          KeepAsBest(out, temps.tmp.path, temps.best.path, &best, std::move(*written), !attempt.fidelity.empty()));
      if (!roomy) break;
      budget += kGoodFill * (limit - size);
      continue;
    }
    if (best) break;  // the last one that fit is the answer
    // Over: the rest of the archive is now measured; aim under the limit by the overshoot and a margin.
    const double rest = static_cast<double>(written->size - written->trace_bytes);
    budget = try_captured ? limit - rest - 16e3 : budget - 1.1 * (size - limit) - 16e3;
    try_captured = false;
  }
  if (best) return Finish(out, temps.best.path, *best, std::move(result));
  return Status::InvalidArgument(out + ": could not fit under --limit " + HumanBytes(limit) + " in " +
                                 std::to_string(kMaxAttempts) + " attempts");
}

}  // namespace gradtrace::pack
