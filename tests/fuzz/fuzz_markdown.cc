// libFuzzer target: the Markdown writers (issue 20, item 3). The input is cut
// into random strings for every field of a Report that comes from a trace, a
// partial report or a path (directories, producer, configuration strings,
// parameter and group names, explanations, summaries, findings, step rows) and
// of a bug-report README (archive and set paths, headline, rerun options,
// fidelity names, attachments); the numbers are random too. The report goes
// through RenderMarkdown and RenderStepTableMarkdown, the README through
// RenderReadme, and each output must hold the invariants a reader pasting it
// into GitHub relies on (CheckMarkdown below). A broken one aborts, so
// libFuzzer saves the input as a crash.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "compare/step_table.h"
#include "fuzz_common.h"
#include "readme.h"
#include "report/report.h"

using namespace gradtrace;

namespace {

// The markup the writers themselves emit outside code spans; everything else of the kind came from the input.
constexpr std::string_view kOwnTags[] = {"<details>", "</details>", "<summary>", "</summary>", "<sub>", "</sub>"};
constexpr std::string_view kOwnEntities[] = {"&amp;", "&lt;", "&gt;", "&#64;", "&#35;", "&#8203;"};

bool StartsWithAny(std::string_view s, size_t at, const std::string_view* list, size_t n, size_t* len) {
  for (size_t i = 0; i < n; ++i) {
    if (s.substr(at, list[i].size()) == list[i]) {
      *len = list[i].size();
      return true;
    }
  }
  return false;
}

[[noreturn]] void Broken(const std::string& what, std::string_view line, const std::string& doc) {
  fuzz::Fail("Markdown invariant broken: " + what + "\n  in line: " + std::string(line) + "\n  document:\n" + doc);
}

// GFM splits a table row at every '|' that no backslash precedes (inside code spans too).
int CellBoundaries(std::string_view line) {
  int n = 0;
  for (size_t i = 0; i < line.size(); ++i) n += line[i] == '|' && (i == 0 || line[i - 1] != '\\');
  return n;
}

// One line outside fenced code blocks: backslash escapes skipped, code spans (a run of N backticks to the
// next run of exactly N on the line) skipped; what is left may hold no raw HTML but the writers' own tags,
// no entity but theirs, no backtick opening nothing, no '@', '#' but a heading's, '[' or ']' (links), and
// no control byte.
void CheckLine(std::string_view line, const std::string& doc) {
  size_t i = 0;
  if (line.substr(0, 1) == "#") {  // a heading the writer made: "### gradtrace-diff: ..."
    while (i < line.size() && line[i] == '#') ++i;
    if (i > 6 || line.substr(i, 1) != " ") Broken("'#' at the start of a line that is no heading", line, doc);
  }
  while (i < line.size()) {
    const auto c = static_cast<unsigned char>(line[i]);
    size_t len = 0;
    if (c < 0x20 || c == 0x7f || (c == 0xc2 && i + 1 < line.size() && (line[i + 1] & 0xe0) == 0x80)) {
      Broken("a control byte", line, doc);
    } else if (c == '\\') {
      i += 2;  // an escaped character is text
    } else if (c == '`') {
      const size_t run = std::min(line.find_first_not_of('`', i), line.size()) - i;
      size_t close = i + run;
      for (;; close = std::min(line.find_first_not_of('`', close), line.size())) {
        close = line.find(std::string(run, '`'), close);
        if (close == std::string_view::npos) Broken("a backtick that opens no code span", line, doc);
        if (std::min(line.find_first_not_of('`', close), line.size()) - close == run) break;
      }
      i = close + run;
    } else if (c == '<' || c == '>') {
      if (!StartsWithAny(line, i, kOwnTags, std::size(kOwnTags), &len)) Broken("raw HTML", line, doc);
      i += len;
    } else if (c == '&') {
      if (!StartsWithAny(line, i, kOwnEntities, std::size(kOwnEntities), &len)) Broken("a raw entity", line, doc);
      i += len;
    } else if (c == '@' || c == '#' || c == '[' || c == ']') {
      Broken(std::string("an unescaped '") + static_cast<char>(c) + "'", line, doc);
    } else {
      ++i;
    }
  }
}

// The invariants of a whole document: every table row starts and ends with '|' and has as many cells as its
// header; a table ends at a blank line (text right after a row would continue the table); no carriage return;
// each line outside fenced code blocks passes CheckLine.
void CheckMarkdown(const std::string& doc) {
  if (doc.find('\r') != std::string::npos) Broken("a carriage return", "", doc);
  int cells = -1;  // boundaries per row of the table being read; -1 outside a table
  size_t fence = 0;
  for (size_t start = 0; start < doc.size();) {
    size_t end = doc.find('\n', start);
    if (end == std::string::npos) end = doc.size();
    const std::string_view line(doc.data() + start, end - start);
    start = end + 1;
    const size_t ticks = std::min(line.find_first_not_of('`'), line.size());
    if (fence > 0) {  // inside a fenced code block: text until a fence as long or longer
      if (ticks >= fence && ticks == line.size()) fence = 0;
      for (char c : line) {
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) Broken("a control byte in a code block", line, doc);
      }
      continue;
    }
    if (ticks >= 3) {
      fence = ticks;
      continue;
    }
    if (line.empty()) {
      cells = -1;
      continue;
    }
    if (line.front() == '|') {
      if (line.size() < 2 || line.back() != '|' || line[line.size() - 2] == '\\') {
        Broken("a table row that does not end with '|'", line, doc);
      }
      const int n = CellBoundaries(line);
      if (cells >= 0 && n != cells) Broken("a row with another cell count than its header", line, doc);
      cells = n;
    } else if (cells >= 0) {
      Broken("text continuing a table", line, doc);
    }
    CheckLine(line, doc);
  }
}

struct Input {
  FuzzedDataProvider& in;
  // Mostly short strings with the bytes that matter here among them.
  std::string Str() { return in.ConsumeRandomLengthString(48); }
  double Num() { return in.ConsumeFloatingPoint<double>(); }
  int Int() { return in.ConsumeIntegral<int>(); }
  template <typename T>
  T Pick(std::initializer_list<T> list) {
    return *(list.begin() + in.ConsumeIntegralInRange<size_t>(0, list.size() - 1));
  }
};

void FillConfig(Input& f, pb::Config* c) {
  c->set_world(f.Int());
  c->set_dp(f.Int());
  c->set_sp(f.Int());
  c->set_zero_stage(f.Int());
  c->set_gas(f.Int());
  c->set_scaling(f.Str());
  c->set_loss(f.Str());
  c->set_capture_mode(f.Str());
  c->set_dtype(static_cast<pb::DType>(f.in.ConsumeIntegralInRange<int>(pb::DType_MIN, pb::DType_MAX)));
}

diff::Report MakeReport(Input& f) {
  diff::Report r;
  r.mode = f.in.ConsumeBool() ? "self" : "diff";
  for (diff::TraceSide* side : {&r.a, &r.b}) {
    side->dir = f.Str();
    side->producer = f.Str();
    side->framework = f.Str();
    side->run_id = f.Str();
    FillConfig(f, &side->config);
  }
  r.step = f.in.ConsumeIntegral<int64_t>();
  r.phase = f.Str();
  r.tolerance.bound = f.Str();
  r.verdict = f.Pick<const char*>(
      {"match", "scaled", "mismatch", "missing", "nonfinite", "incomplete", "ok", "different-start", "different-data"});
  r.summary = f.Str();
  // Up to 60 rows: past 50 the parameter table goes under <details>.
  const int rows = f.in.ConsumeIntegralInRange<int>(0, f.in.ConsumeBool() ? 60 : 4);
  for (int i = 0; i < rows; ++i) {
    if (r.mode == "self") {
      diff::SelfParam p;
      p.name = f.Str();
      p.numel = f.in.ConsumeIntegral<int64_t>();
      p.group = f.Str();
      p.group_size = f.Int();
      p.divisor = f.Num();
      p.expected = f.Num();
      p.residual = f.Num();
      p.verdict = static_cast<diff::SelfVerdict>(f.in.ConsumeIntegralInRange<int>(0, 3));
      r.self_params.push_back(std::move(p));
    } else {
      diff::ParamResult p;
      p.name = f.Str();
      p.numel = f.in.ConsumeIntegral<int64_t>();
      p.verdict = static_cast<diff::Verdict>(f.in.ConsumeIntegralInRange<int>(0, 4));
      p.metrics.basis = static_cast<diff::Basis>(f.in.ConsumeIntegralInRange<int>(0, 3));
      p.metrics.scale = f.Num();
      p.metrics.residual = f.Num();
      p.metrics.cosine = f.Num();
      p.metrics.rel_error = f.Num();
      p.metrics.max_abs_error = f.Num();
      r.params.push_back(std::move(p));
    }
  }
  for (int i = f.in.ConsumeIntegralInRange<int>(0, 3); i > 0; --i) {
    diff::Group g;
    g.kind = f.Str();
    if (f.in.ConsumeBool()) g.scale = f.Num();
    g.count = f.Int();
    g.explanation = f.Str();
    r.groups.push_back(std::move(g));
  }
  for (int i = f.in.ConsumeIntegralInRange<int>(0, 3); i > 0; --i) r.findings.push_back({f.Str(), f.Str()});
  for (int i = f.in.ConsumeIntegralInRange<int>(0, 3); i > 0; --i) {
    diff::StepRow row;
    row.step = f.in.ConsumeIntegral<int64_t>();
    row.verdict = r.verdict;  // computed by the judge, never read from an input
    row.match = f.Int();
    row.differ = f.Int();
    row.worst_residual = f.Num();
    row.summary = f.Str();
    r.steps.push_back(std::move(row));
  }
  return r;
}

pack::ReadmeFacts MakeReadme(Input& f) {
  pack::ReadmeFacts facts;
  facts.archive = f.Str();
  facts.sources.push_back(f.Str());
  if (f.in.ConsumeBool()) facts.sources.push_back(f.Str());
  facts.mode = facts.sources.size() > 1 ? "diff" : "self";
  facts.diff_options = f.Str();
  facts.headline = f.Str();
  facts.exit_code = f.Int();
  facts.captured_bytes = f.in.ConsumeIntegral<uint64_t>();
  facts.packed_trace_bytes = f.in.ConsumeIntegral<uint64_t>();
  facts.limit = f.in.ConsumeIntegral<uint64_t>();
  for (int i = f.in.ConsumeIntegralInRange<int>(0, 3); i > 0; --i) {
    pack::Choice c;
    c.name = f.Str();
    c.mode.kind = static_cast<CaptureMode::Kind>(f.in.ConsumeIntegralInRange<int>(0, 2));
    c.mode.k = f.Int();
    c.why = f.Str();
    facts.fidelity.push_back(std::move(c));
  }
  for (int i = f.in.ConsumeIntegralInRange<int>(0, 2); i > 0; --i) facts.attachments.push_back(f.Str());
  facts.original_report = f.in.ConsumeBool();
  return facts;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider provider(data, size);
  Input f{provider};
  const diff::Report report = MakeReport(f);
  CheckMarkdown(diff::RenderMarkdown(report));
  diff::StepTable table;
  table.steps = {report};
  table.verdict = report.verdict;
  table.summary = f.Str();
  CheckMarkdown(diff::RenderStepTableMarkdown(table));
  CheckMarkdown(pack::RenderReadme(MakeReadme(f)));
  return 0;
}
