// gradtrace-diff: compare two trace sets (or check one against itself), whole
// or as N shards (--shard K/N, each writing a partial report) and a --merge of
// the parts into the report one process would have written.
// Exit codes follow diff(1): 0 all match, 1 differences found, 2 bad input or
// usage -- the last with exactly one line "gradtrace-diff: <file>: <what>" on stderr.
#include <malloc.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>

#include "archive.h"
#include "compare/diff_engine.h"
#include "compare/merge.h"
#include "compare/step_table.h"
#include "evidence/self_check.h"
#include "load/packed_run.h"
#include "load/term_set.h"
#include "report/atomic_file.h"
#include "report/partial_report.h"
#include "report/report.h"
#include "text_escape.h"

namespace {

int Fail(std::string message) {
  for (char& c : message) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!message.empty() && message.back() == ' ') message.pop_back();
  // Other control bytes come from a path or a name: escaped, as in the text report.
  std::fprintf(stderr, "gradtrace-diff: %s\n", gradtrace::TerminalSafe(message).c_str());
  return 2;
}

// A report file to write when its path is given.
struct Output {
  const std::string& path;
  std::function<std::string()> render;
};

// Writes the requested files (each complete or untouched; one failing does
// not undo the others), prints the text report, and returns `exit_code`, or 2
// when a file cannot be written.
int Emit(std::initializer_list<Output> files, const std::function<std::string(bool colour)>& text, int exit_code) {
  for (const Output& out : files) {
    if (out.path.empty()) continue;
    gradtrace::Status st = gradtrace::diff::WriteFileAtomic(out.path, out.render());
    if (!st.ok()) return Fail(st.message());
  }
  const bool colour = ::isatty(STDOUT_FILENO) && std::getenv("NO_COLOR") == nullptr;
  const std::string printed = text(colour);
  std::fwrite(printed.data(), 1, printed.size(), stdout);
  std::fflush(stdout);
  return exit_code;
}

// --shard K/N: one share of the comparison, written as a partial report. Exit
// 0 when the part is written: the verdict belongs to the merge.
int RunShard(const std::string& a_dir, const std::string& b_dir, const std::string& shard_text,
             const std::string& json_path, const std::string& md_path, const std::string& html_path, bool bucket_views,
             gradtrace::diff::DiffOptions o) {
  using namespace gradtrace;
  auto shard = diff::ParseShard(shard_text);
  if (!shard.ok()) return Fail(shard.status().message());
  if (json_path.empty()) return Fail("--shard needs --json FILE for the partial report");
  if (!md_path.empty() || !html_path.empty())
    return Fail("--shard writes JSON only; give --markdown/--html to --merge");
  o.shard = *shard;
  // A merge that writes HTML draws each side's bucket view: a --self pass per side, so only on request
  // (--bucket-views), and only shard 0 computes and carries it (the others would repeat it).
  o.bucket_view = bucket_views && o.shard.k == 0;
  auto c = diff::RunCompare(a_dir, b_dir, o);
  if (!c.ok()) return Fail(c.status().message());
  Status st = diff::WriteFileAtomic(json_path, diff::RenderPartialJson(*c));
  if (!st.ok()) return Fail(st.message());
  int64_t elements = 0;
  for (const auto& p : c->params) elements += p.problem.empty() ? p.numel : 0;
  std::printf(
      "shard %d/%d: %zu of %zu parameters (%lld elements) in %s; merge all %d parts with gradtrace-diff --merge\n",
      o.shard.k, o.shard.n, c->params.size(), c->param_count, static_cast<long long>(elements), json_path.c_str(),
      o.shard.n);
  return 0;
}

// --step all (of a diff or --self): a row per step, then the first differing
// step in full. --html gets that step's report (or the last step's when all match).
int EmitTable(gradtrace::Expected<gradtrace::diff::StepTable> table, const std::string& json_path,
              const std::string& md_path, const std::string& html_path, size_t top) {
  using namespace gradtrace;
  if (!table.ok()) return Fail(table.status().message());
  const diff::Report* detail = &table->Shown();
  return Emit(
      {{json_path, [&] { return diff::RenderStepTableJson(*table); }},
       {md_path, [&] { return diff::RenderStepTableMarkdown(*table); }},
       {html_path, [&] { return diff::RenderHtml(*detail, top); }}},
      [&](bool colour) { return diff::RenderStepTableText(*table, colour, top); }, table->ExitCode());
}

// Everything the command line says.
struct CommandLine {
  std::string a_dir, b_dir, self_dir, phase = "final", noise, json_path, md_path, html_path, shard_text, step_text;
  std::string baseline, baseline_b;  // --baseline C [--baseline-b CB]: the term's part, each side minus its baseline
  std::vector<std::string> merge_paths, renames;
  std::optional<double> rtol;
  int threads = 0;
  size_t top = 0;               // 0: each output's default (report/rows.h)
  std::optional<int64_t> step;  // --step N
  bool all_steps = false;       // --step all
  bool bucket_views = false;    // --bucket-views (with --shard)
};

void AddOptions(CLI::App& app, CommandLine* cl) {
  app.add_option("A", cl->a_dir,
                 "reference trace set (directory of rank-*.gtrace, or ARCHIVE:a of a bug-report archive); "
                 "a lone archive reruns the comparison packed in it");
  app.add_option("B", cl->b_dir, "trace set to compare against A");
  app.add_option("--self", cl->self_dir, "check one trace set: POST_REDUCE against the sum of PRE_REDUCE per group");
  // --phase, --step, --rtol and --rename are checked by diff::ValidateDiffOptions, as an archive's are.
  app.add_option("--phase", cl->phase, "phase to compare: final, post or pre");
  app.add_option("--step", cl->step_text,
                 "step to compare, or 'all' for a table with a row per step (default: every step both sets recorded, "
                 "reporting the first that differs; --shard: the first step both recorded)");
  app.add_option("--rtol", cl->rtol, "relative tolerance (overrides the dtype/summand bound and --noise)");
  app.add_option("--noise", cl->noise, "second reference trace set: measure the tolerance as the A-vs-A2 difference");
  app.add_option("--baseline", cl->baseline,
                 "the same run with a suspected loss term switched off (its coefficient 0): compare the term's part, "
                 "A - BASELINE against B - BASELINE (full traces)");
  app.add_option("--baseline-b", cl->baseline_b,
                 "B's own baseline when B's configuration differs from A's: B - BASELINE_B; the main parts, BASELINE "
                 "against BASELINE_B, are compared too");
  app.add_option("--rename", cl->renames,
                 "rename rule 'REGEX=REPL' applied to both sides' parameter names (repeatable)");
  app.add_option("--shard", cl->shard_text,
                 "compare only share K of N (0 <= K < N) and write a partial report to --json; see --merge");
  app.add_flag("--bucket-views", cl->bucket_views,
               "with --shard: shard 0 also measures each side's per-rank x per-bucket reductions (a --self pass "
               "per side) for a --merge that writes --html");
  app.add_option("--merge", cl->merge_paths,
                 "merge the partial reports of all N shards into the report of the whole diff")
      ->expected(1, -1);
  app.add_option("--json", cl->json_path, "write the JSON report to FILE");
  app.add_option("--markdown", cl->md_path, "write a Markdown report (for a GitHub issue) to FILE");
  app.add_option("--html", cl->html_path, "write a self-contained HTML report with an SVG chart to FILE");
  app.add_option("--top", cl->top,
                 "the N worst parameters in the text, Markdown and HTML tables, with every problem after them (default "
                 "50 in text and Markdown, 500 in HTML); the JSON report lists every parameter")
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", cl->threads, "worker threads (default: all cores)")->check(CLI::NonNegativeNumber);
}

// One archive argument: rerun the comparison packed in it, with the options
// it was packed with unless given here.
gradtrace::Status UsePackedDiff(const CLI::App& app, CommandLine* cl) {
  using namespace gradtrace;
  if (!cl->merge_paths.empty() || !cl->self_dir.empty() || cl->a_dir.empty() || !cl->b_dir.empty() ||
      !LooksLikeArchive(cl->a_dir)) {
    return Status::Ok();
  }
  auto packed = diff::ReadPackedDiff(cl->a_dir);
  if (!packed.ok()) return packed.status();
  if (app.count("--phase") == 0) cl->phase = packed->phase;
  if (app.count("--step") == 0 && packed->step) cl->step_text = std::to_string(*packed->step);
  if (app.count("--rtol") == 0) cl->rtol = packed->rtol;
  if (app.count("--rename") == 0) cl->renames = packed->renames;
  if (packed->mode == "self") {
    cl->self_dir = cl->a_dir + ":" + diff::kPackSetA;
    cl->a_dir.clear();
  } else {
    cl->b_dir = cl->a_dir + ":" + diff::kPackSetB;
    cl->a_dir += std::string(":") + diff::kPackSetA;
  }
  return Status::Ok();
}

// --step: a step number, or 'all'; checked with the other options ValidateDiffOptions checks.
gradtrace::Status ParseStepAndCheck(CommandLine* cl) {
  using namespace gradtrace;
  cl->all_steps = cl->step_text == "all";
  if (!cl->step_text.empty() && !cl->all_steps) {
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(cl->step_text.c_str(), &end, 10);
    if (errno != 0 || end == cl->step_text.c_str() || *end != '\0' || n < 0) {
      return Status::InvalidArgument("--step: expected a step number or 'all', got '" + cl->step_text + "'");
    }
    cl->step = n;
  }
  if (cl->all_steps && !cl->shard_text.empty()) return Status::InvalidArgument("--step all does not take --shard");
  if (!cl->merge_paths.empty()) return Status::Ok();
  diff::PackedDiff asked{.mode = cl->self_dir.empty() ? "diff" : "self",
                         .phase = cl->phase,
                         .step = cl->step,
                         .rtol = cl->rtol,
                         .renames = cl->renames};
  return diff::ValidateDiffOptions(asked, diff::OptionSource::kCommandLine);
}

// The report's files and its text on stdout; exit code the report's (2 when a file cannot be written).
int EmitReport(gradtrace::Expected<gradtrace::diff::Report> report, const CommandLine& cl) {
  using namespace gradtrace;
  if (!report.ok()) return Fail(report.status().message());
  return Emit(
      {{cl.json_path, [&] { return diff::RenderJson(*report); }},
       {cl.md_path, [&] { return diff::RenderMarkdown(*report, cl.top); }},
       {cl.html_path, [&] { return diff::RenderHtml(*report, cl.top); }}},
      [&](bool colour) { return diff::RenderText(*report, colour, cl.top); }, report->ExitCode());
}

// --merge PART...: the parts' comparison, judged as one process would.
int RunMerge(const CLI::App& app, const CommandLine& cl) {
  using namespace gradtrace;
  if (!cl.a_dir.empty() || !cl.b_dir.empty() || !cl.self_dir.empty() || !cl.shard_text.empty()) {
    return Fail("--merge takes partial reports only (no A B, --self or --shard)");
  }
  for (const char* opt : {"--phase", "--step", "--rtol", "--noise", "--rename"}) {
    if (app.count(opt) > 0) return Fail(std::string("--merge takes ") + opt + " from the parts; drop it");
  }
  // As in a single-process diff, the bucket views (from shard 0's part) are reported only with --html.
  auto merged = diff::MergeParts(cl.merge_paths, !cl.html_path.empty());
  if (!merged.ok()) return Fail(merged.status().message());
  if (!cl.html_path.empty() && merged->a.bucket_view.empty() && merged->b.bucket_view.empty()) {
    std::fprintf(stderr,
                 "gradtrace-diff --merge: no part carries the sides' per-bucket views (shard 0 measures them with "
                 "--bucket-views, where the sets hold PRE_REDUCE and POST_REDUCE): the HTML draws none\n");
  }
  return EmitReport(diff::JudgeComparison(*merged), cl);
}

// --self SET.
int RunSelf(const CommandLine& cl) {
  using namespace gradtrace;
  if (!cl.a_dir.empty() || !cl.b_dir.empty()) return Fail("--self takes one trace set and no positional A B");
  if (!cl.noise.empty()) return Fail("--self does not take --noise");
  // The self-check's unit of work is one bucket's reduction over a group, not a parameter.
  if (!cl.shard_text.empty()) return Fail("--self does not take --shard");
  diff::SelfOptions o;
  o.step = cl.step;
  o.rtol = cl.rtol;
  o.threads = cl.threads;
  o.progress = true;
  if (cl.all_steps) {
    return EmitTable(diff::RunSelfCheckAllSteps(cl.self_dir, o), cl.json_path, cl.md_path, cl.html_path, cl.top);
  }
  return EmitReport(diff::RunSelfCheckSteps(cl.self_dir, o), cl);
}

// A B --baseline C [--baseline-b CB]: the diff of the term's parts (each side minus its baseline, written by
// load/term_set.h into a private directory), the main parts' verdict said in a note.
int RunDecomposed(const CommandLine& cl, const gradtrace::diff::DiffOptions& o) {
  using namespace gradtrace;
  if (!cl.shard_text.empty() || cl.all_steps || !cl.noise.empty() || cl.phase != "final") {
    return Fail("--baseline compares FINAL of one diff: no --shard, --step all, --noise or --phase");
  }
  const std::string base_b = cl.baseline_b.empty() ? cl.baseline : cl.baseline_b;
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/gradtrace-terms-XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) return Fail(dir + ": cannot create a directory for the term's traces");
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{dir};
  std::fprintf(stderr, "gradtrace-diff: the term's part: A - %s, B - %s\n", TerminalSafe(cl.baseline).c_str(),
               TerminalSafe(base_b).c_str());
  diff::DiffOptions terms = o;  // each parameter's tolerance scaled by its cancellation (term_set.h)
  for (const auto& [side, base, out] :
       {std::tuple{cl.a_dir, cl.baseline, dir + "/a"}, std::tuple{cl.b_dir, base_b, dir + "/b"}}) {
    auto ratios = diff::WriteTermSet(side, base, out);
    if (!ratios.ok()) return Fail(ratios.status().message());
    for (const auto& [name, r] : *ratios) terms.rtol_scale[name] = std::max(terms.rtol_scale[name], r);
  }
  auto report = diff::RunDiffSteps(dir + "/a", dir + "/b", terms);
  if (!report.ok()) return Fail(report.status().message());
  report->a.dir = cl.a_dir + " - " + cl.baseline;
  report->b.dir = cl.b_dir + " - " + base_b;
  std::string main_part = "the main part is the baseline " + cl.baseline + " on both sides";
  if (!cl.baseline_b.empty()) {
    auto main = diff::RunDiffSteps(cl.baseline, cl.baseline_b, o);
    if (!main.ok()) return Fail(main.status().message());
    main_part = "the main part (" + cl.baseline + " against " + cl.baseline_b + "): " + main->summary;
  }
  report->findings.push_back({"note",
                              "decomposition: this report compares the term's part of each side (the side "
                              "minus its baseline, the same run with the term switched off); " +
                                  main_part});
  return EmitReport(std::move(report), cl);
}

// A B: the whole diff, one shard of it, or its step table.
int RunTwoSets(const CommandLine& cl) {
  using namespace gradtrace;
  if (cl.a_dir.empty() || cl.b_dir.empty()) {
    return Fail(
        "usage: gradtrace-diff A B [options] | gradtrace-diff --self A | gradtrace-diff ARCHIVE | gradtrace-diff "
        "--merge PART...");
  }
  diff::DiffOptions o;
  o.phase = cl.phase == "pre" ? pb::PRE_REDUCE : cl.phase == "post" ? pb::POST_REDUCE : pb::FINAL;
  o.step = cl.step;
  o.rtol = cl.rtol;
  o.noise_dir = cl.noise;
  o.renames = cl.renames;
  o.threads = cl.threads;
  o.progress = true;
  // Each side's bucket view is a full --self pass per side: only for the HTML report (--step all: of the step
  // it draws; --shard sets its own).
  o.bucket_view = !cl.html_path.empty();
  if (!cl.baseline.empty()) return RunDecomposed(cl, o);
  if (!cl.baseline_b.empty()) return Fail("--baseline-b goes with --baseline");
  if (!cl.shard_text.empty()) {
    return RunShard(cl.a_dir, cl.b_dir, cl.shard_text, cl.json_path, cl.md_path, cl.html_path, cl.bucket_views, o);
  }
  if (cl.all_steps) {
    return EmitTable(diff::RunDiffAllSteps(cl.a_dir, cl.b_dir, o), cl.json_path, cl.md_path, cl.html_path, cl.top);
  }
  return EmitReport(diff::RunDiffSteps(cl.a_dir, cl.b_dir, o), cl);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gradtrace;
  // Frame and gradient buffers are MiBs and short-lived: keep freed memory in
  // the heap for the next one instead of unmapping it, so each frame does not
  // pay for fresh page faults (they cost more than zstd). 32 MiB is the most
  // glibc takes for M_MMAP_THRESHOLD (it refused 256 MiB, keeping its default).
  // Not one arena for all threads (M_ARENA_MAX 1): 2.7x the wall time on the
  // 64-rank sketch sets, whose threads allocate per position
  // (docs/dev/performance.md).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  CLI::App app{"gradtrace-diff: compare gradient traces per parameter and explain scale factors", "gradtrace-diff"};
  CommandLine cl;
  AddOptions(app, &cl);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return Fail(e.what());
  }
  if (Status st = UsePackedDiff(app, &cl); !st.ok()) return Fail(st.message());
  if (Status st = ParseStepAndCheck(&cl); !st.ok()) return Fail(st.message());
  if (cl.bucket_views && cl.shard_text.empty())
    return Fail("--bucket-views goes with --shard (a diff or --self with --html measures the views itself)");
  if (!cl.merge_paths.empty()) return RunMerge(app, cl);
  if (!cl.self_dir.empty()) return RunSelf(cl);
  return RunTwoSets(cl);
}
