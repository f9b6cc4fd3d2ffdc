// gradtrace-diff: compare two trace sets (or check one against itself), whole
// or as N shards (--shard K/N, each writing a partial report) and a --merge of
// the parts into the report one process would have written.
// Exit codes follow diff(1): 0 all match, 1 differences found, 2 bad input or
// usage -- the last with exactly one line "gradtrace-diff: <file>: <what>" on stderr.
#include <malloc.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>

#include "archive.h"
#include "compare/diff_engine.h"
#include "compare/merge.h"
#include "compare/step_table.h"
#include "evidence/self_check.h"
#include "load/packed_run.h"
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
             const std::string& json_path, const std::string& md_path, const std::string& html_path,
             gradtrace::diff::DiffOptions o) {
  using namespace gradtrace;
  auto shard = diff::ParseShard(shard_text);
  if (!shard.ok()) return Fail(shard.status().message());
  if (json_path.empty()) return Fail("--shard needs --json FILE for the partial report");
  if (!md_path.empty() || !html_path.empty())
    return Fail("--shard writes JSON only; give --markdown/--html to --merge");
  o.shard = *shard;
  // The merge may write HTML, which draws each side's bucket view: shard 0 computes it and carries it.
  o.bucket_view = o.shard.k == 0;
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
       {html_path, [&] { return diff::RenderHtml(*detail); }}},
      [&](bool colour) { return diff::RenderStepTableText(*table, colour, top); }, table->ExitCode());
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gradtrace;
  // Frame and gradient buffers are tens of MiB and short-lived: keep freed
  // memory in the heap for the next one instead of unmapping it, so each
  // frame does not pay for fresh page faults (they cost more than zstd).
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  CLI::App app{"gradtrace-diff: compare gradient traces per parameter and explain scale factors", "gradtrace-diff"};
  std::string a_dir, b_dir, self_dir, phase = "final", noise, json_path, md_path, html_path, shard_text;
  std::vector<std::string> merge_paths;
  std::string step_text;
  std::optional<double> rtol;
  std::vector<std::string> renames;
  int threads = 0;
  size_t top = SIZE_MAX;
  app.add_option("A", a_dir,
                 "reference trace set (directory of rank-*.gtrace, or ARCHIVE:a of a bug-report archive); "
                 "a lone archive reruns the comparison packed in it");
  app.add_option("B", b_dir, "trace set to compare against A");
  app.add_option("--self", self_dir, "check one trace set: POST_REDUCE against the sum of PRE_REDUCE per group");
  // --phase, --step, --rtol and --rename are checked by diff::ValidateDiffOptions, as an archive's are.
  app.add_option("--phase", phase, "phase to compare: final, post or pre");
  app.add_option("--step", step_text,
                 "step to compare, or 'all' for a table with a row per step (default: every step both sets recorded, "
                 "reporting the first that differs; --shard: the first step both recorded)");
  app.add_option("--rtol", rtol, "relative tolerance (overrides the dtype/summand bound and --noise)");
  app.add_option("--noise", noise, "second reference trace set: measure the tolerance as the A-vs-A2 difference");
  app.add_option("--rename", renames, "rename rule 'REGEX=REPL' applied to both sides' parameter names (repeatable)");
  app.add_option("--shard", shard_text,
                 "compare only share K of N (0 <= K < N) and write a partial report to --json; see --merge");
  app.add_option("--merge", merge_paths, "merge the partial reports of all N shards into the report of the whole diff")
      ->expected(1, -1);
  app.add_option("--json", json_path, "write the JSON report to FILE");
  app.add_option("--markdown", md_path, "write a Markdown report (for a GitHub issue) to FILE");
  app.add_option("--html", html_path, "write a self-contained HTML report with an SVG chart to FILE");
  app.add_option("--top", top, "print only the N worst parameters in the table (default: all)");
  app.add_option("--threads", threads, "worker threads (default: all cores)")->check(CLI::NonNegativeNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return Fail(e.what());
  }

  // One archive argument: rerun the comparison packed in it, with the options
  // it was packed with unless given here.
  if (merge_paths.empty() && self_dir.empty() && !a_dir.empty() && b_dir.empty() && LooksLikeArchive(a_dir)) {
    auto packed = diff::ReadPackedDiff(a_dir);
    if (!packed.ok()) return Fail(packed.status().message());
    if (app.count("--phase") == 0) phase = packed->phase;
    if (app.count("--step") == 0 && packed->step) step_text = std::to_string(*packed->step);
    if (app.count("--rtol") == 0) rtol = packed->rtol;
    if (app.count("--rename") == 0) renames = packed->renames;
    if (packed->mode == "self") {
      self_dir = a_dir + ":" + diff::kPackSetA;
      a_dir.clear();
    } else {
      b_dir = a_dir + ":" + diff::kPackSetB;
      a_dir += std::string(":") + diff::kPackSetA;
    }
  }

  std::optional<int64_t> step;
  const bool all_steps = step_text == "all";
  if (!step_text.empty() && !all_steps) {
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(step_text.c_str(), &end, 10);
    if (errno != 0 || end == step_text.c_str() || *end != '\0' || n < 0) {
      return Fail("--step: expected a step number or 'all', got '" + step_text + "'");
    }
    step = n;
  }
  if (all_steps && !shard_text.empty()) return Fail("--step all does not take --shard");
  if (merge_paths.empty()) {
    diff::PackedDiff asked{
        .mode = self_dir.empty() ? "diff" : "self", .phase = phase, .step = step, .rtol = rtol, .renames = renames};
    if (Status st = diff::ValidateDiffOptions(asked, diff::OptionSource::kCommandLine); !st.ok()) {
      return Fail(st.message());
    }
  }

  Expected<diff::Report> report = Status::InvalidArgument("");
  if (!merge_paths.empty()) {
    if (!a_dir.empty() || !b_dir.empty() || !self_dir.empty() || !shard_text.empty()) {
      return Fail("--merge takes partial reports only (no A B, --self or --shard)");
    }
    for (const char* opt : {"--phase", "--step", "--rtol", "--noise", "--rename"}) {
      if (app.count(opt) > 0) return Fail(std::string("--merge takes ") + opt + " from the parts; drop it");
    }
    // As in a single-process diff, the bucket views (from shard 0's part) are reported only with --html.
    auto merged = diff::MergeParts(merge_paths, !html_path.empty());
    if (!merged.ok()) return Fail(merged.status().message());
    report = diff::JudgeComparison(*merged);
  } else if (!self_dir.empty()) {
    if (!a_dir.empty() || !b_dir.empty()) return Fail("--self takes one trace set and no positional A B");
    if (!noise.empty()) return Fail("--self does not take --noise");
    // The self-check's unit of work is one bucket's reduction over a group, not a parameter.
    if (!shard_text.empty()) return Fail("--self does not take --shard");
    diff::SelfOptions o;
    o.step = step;
    o.rtol = rtol;
    o.threads = threads;
    o.progress = true;
    if (all_steps) return EmitTable(diff::RunSelfCheckAllSteps(self_dir, o), json_path, md_path, html_path, top);
    report = diff::RunSelfCheckSteps(self_dir, o);
  } else {
    if (a_dir.empty() || b_dir.empty()) {
      return Fail(
          "usage: gradtrace-diff A B [options] | gradtrace-diff --self A | gradtrace-diff ARCHIVE | gradtrace-diff "
          "--merge PART...");
    }
    diff::DiffOptions o;
    o.phase = phase == "pre" ? pb::PRE_REDUCE : phase == "post" ? pb::POST_REDUCE : pb::FINAL;
    o.step = step;
    o.rtol = rtol;
    o.noise_dir = noise;
    o.renames = renames;
    o.threads = threads;
    o.progress = true;
    // Each side's bucket view is a full --self pass per side: only for the HTML report (--step all: of the step
    // it draws; --shard sets its own).
    o.bucket_view = !html_path.empty();
    if (!shard_text.empty()) return RunShard(a_dir, b_dir, shard_text, json_path, md_path, html_path, o);
    if (all_steps) return EmitTable(diff::RunDiffAllSteps(a_dir, b_dir, o), json_path, md_path, html_path, top);
    report = diff::RunDiffSteps(a_dir, b_dir, o);
  }
  if (!report.ok()) return Fail(report.status().message());

  return Emit(
      {{json_path, [&] { return diff::RenderJson(*report); }},
       {md_path, [&] { return diff::RenderMarkdown(*report); }},
       {html_path, [&] { return diff::RenderHtml(*report); }}},
      [&](bool colour) { return diff::RenderText(*report, colour, top); }, report->ExitCode());
}
