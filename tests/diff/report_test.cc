#include "report/report.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "compare/diff_engine.h"
#include "evidence/self_check.h"
#include "report/atomic_file.h"
#include "report/json_io.h"
#include "test_dirs.h"

namespace gradtrace::diff {
namespace {
using testing::Config;
using testing::Reference;
using testing::Synth;

int Count(const std::string& hay, const std::string& needle) {
  int n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + needle.size())) ++n;
  return n;
}

Report Sp2Report() {
  auto r = RunDiff(Synth("ref", Reference()), Synth("sp2", Config(1, 2, 2, "ds-4530", "local-mean")), {});
  EXPECT_TRUE(r.ok());
  return std::move(*r);
}

TEST(Reports, TextIsPlainWithoutColourAndColouredWith) {
  Report r = Sp2Report();
  std::string plain = RenderText(r, false);
  EXPECT_EQ(plain.find('\033'), std::string::npos);
  EXPECT_NE(plain.find("B/A = 2.000 = sp(B) for all 14 parameters"), std::string::npos);
  EXPECT_NE(plain.find("Verdict: scaled"), std::string::npos);
  EXPECT_NE(RenderText(r, true).find("\033[33m"), std::string::npos);
}

TEST(Reports, TopLimitsTheTableButNotTheGroups) {
  Report r = Sp2Report();
  std::string all = RenderText(r, false);
  std::string top3 = RenderText(r, false, 3);
  EXPECT_EQ(Count(all, "\nscaled "), 14);
  EXPECT_EQ(Count(top3, "\nscaled "), 3);
  EXPECT_NE(top3.find("... 11 more: 11 scaled (--top N shows more; --json lists every parameter)"), std::string::npos)
      << top3;
  EXPECT_NE(top3.find("B/A = 2.000 = sp(B) for all 14 parameters"), std::string::npos);
  EXPECT_EQ(all.find("more (--top"), std::string::npos);
}

// Issue 42: a 100,000-parameter diff wrote a 62 MB HTML page (a chart mark, a title and a row per parameter)
// and ten 1 MiB names a 52 MB one. The human reports show the worst rows and every problem and count the rest;
// the chart aggregates; long names are cut. The JSON keeps every parameter, whole.
Report ManyParams(size_t n, size_t mismatches, size_t long_names) {
  Report r;
  r.verdict = "mismatch";
  r.summary = "many";
  for (size_t i = 0; i < n; ++i) {
    ParamResult p;
    p.name = "model.layers." + std::to_string(i / 1000) + ".mlp.experts." + std::to_string(i % 1000) + ".w";
    if (i < long_names) p.name = std::string(1 << 20, 'a' + static_cast<char>(i % 26)) + "." + std::to_string(i);
    p.numel = 16;
    p.metrics.basis = Basis::kStats;
    p.metrics.scale = i < mismatches ? 0.5 : i % 2 == 0 ? 2.0 : 1.0;
    p.metrics.residual = i < mismatches ? 0.3 : 1e-7;
    p.verdict = i < mismatches ? Verdict::kMismatch : i % 2 == 0 ? Verdict::kScaled : Verdict::kMatch;
    r.params.push_back(std::move(p));
  }
  return r;
}

TEST(Reports, AHundredThousandParametersMakeReportsForPeople) {
  const Report r = ManyParams(100000, 700, 0);
  const std::string html = RenderHtml(r), md = RenderMarkdown(r), text = RenderText(r, false);
  EXPECT_LT(html.size(), 1u << 20) << html.size();
  // The 500 worst rows and the 200 problems after them; the rest counted.
  EXPECT_EQ(Count(html, "<tr><td class=\"v\""), 700);
  EXPECT_EQ(Count(html, ">mismatch</td>"), 700);
  EXPECT_NE(html.find("99,300 more: 49,650 match, 49,650 scaled (the table shows"), std::string::npos);
  // 400 columns per panel, no per-parameter mark.
  EXPECT_EQ(Count(html, "class=\"bin scale\""), 400);
  EXPECT_EQ(Count(html, "class=\"bin residual\""), 400);
  EXPECT_EQ(Count(html, "class=\"mark "), 0);
  EXPECT_NE(html.find("each column spans 250: hover it for its range"), std::string::npos);
  EXPECT_NE(html.find("<title>parameters 1-250 of 100,000: "), std::string::npos);
  // Text and Markdown: 50 rows, then the problems (700 in all), and the count of the rest.
  EXPECT_EQ(Count(text, "\nmismatch "), 700);
  EXPECT_NE(text.find("... 99,300 more: 49,650 match, 49,650 scaled (--top N shows more"), std::string::npos);
  EXPECT_LT(text.size(), 200u << 10);
  EXPECT_EQ(Count(md, "| mismatch | "), 700);
  EXPECT_NE(md.find("<summary>The 700 worst of 100,000 parameters</summary>"), std::string::npos);
  EXPECT_LT(md.size(), 200u << 10);
  // --top: more rows where asked.
  EXPECT_EQ(Count(RenderHtml(r, 2000), "<tr><td class=\"v\""), 2000);
  // JSON: every parameter.
  EXPECT_EQ(nlohmann::json::parse(RenderJson(r))["params"].size(), 100000u);
}

TEST(Reports, LongNamesAreCutForPeopleAndWholeInJson) {
  const Report r = ManyParams(12, 0, 10);
  const std::string html = RenderHtml(r), md = RenderMarkdown(r), text = RenderText(r, false);
  EXPECT_LT(html.size(), 64u << 10) << html.size();
  EXPECT_LT(md.size(), 16u << 10) << md.size();
  EXPECT_LT(text.size(), 16u << 10) << text.size();
  EXPECT_EQ(Count(html, "(a name of 1,048,578 bytes: whole in the JSON report)"), 10);  // 1 MiB + ".0" ... ".9"
  // A long name under 4 KiB unfolds to the whole of it.
  Report shorter = ManyParams(3, 0, 0);
  shorter.params[0].name = std::string(300, 'x') + ".tail";
  const std::string page = RenderHtml(shorter);
  EXPECT_NE(page.find("<details><summary><code>xxxxxxxx"), std::string::npos);
  EXPECT_NE(page.find("<code>" + std::string(300, 'x') + ".tail</code></details>"), std::string::npos);
  auto j = nlohmann::json::parse(RenderJson(r));
  EXPECT_EQ(j["params"][0]["name"].get<std::string>().size(), (1u << 20) + 2);
}

TEST(Reports, JsonHasTheContractFields) {
  Report r = Sp2Report();
  std::string j = RenderJson(r);
  for (const char* key : {"\"verdict\": \"scaled\"", "\"params\": [", "\"groups\": [", "\"config_a\": {",
                          "\"config_b\": {", "\"step\": 0", "\"phase\": \"final\"", "\"explanation\": "}) {
    EXPECT_NE(j.find(key), std::string::npos) << key;
  }
  EXPECT_EQ(Count(j, "\"max_abs_error\": "), 14);
  EXPECT_EQ(Count(j, "\"cosine\": "), 14);
}

TEST(Reports, HtmlIsSelfContainedWithOneMarkPerParameter) {
  Report r = Sp2Report();
  std::string h = RenderHtml(r);
  EXPECT_EQ(Count(h, "<svg"), 1);
  EXPECT_EQ(Count(h, "class=\"mark scale"), 14);
  EXPECT_EQ(Count(h, "class=\"mark residual\""), 14);
  EXPECT_EQ(h.find("<script"), std::string::npos);
  EXPECT_EQ(h.find("<link"), std::string::npos);
  EXPECT_EQ(Count(h, "http"), 1);  // the SVG namespace only
}

TEST(Reports, MarkdownIsATableWithTheExplanation) {
  Report r = Sp2Report();
  std::string m = RenderMarkdown(r);
  EXPECT_NE(m.find("| verdict | parameter | numel | scale | residual |"), std::string::npos);
  EXPECT_NE(m.find("**B/A = 2.000 = sp(B) for all 14 parameters"), std::string::npos);
  EXPECT_EQ(Count(m, "| scaled | `"), 14);
}

TEST(Reports, SelfCheckRendersToo) {
  auto r = RunSelfCheck(Synth("b", Config(2, 2, 2, "ds-4530", "local-mean")), {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Count(RenderHtml(*r), "class=\"mark scale"), 14);
  EXPECT_NE(RenderText(*r, false).find("wrong-divisor"), std::string::npos);
  auto j = nlohmann::json::parse(RenderJson(*r));
  EXPECT_EQ(j["self_params"].size(), 14u);
  EXPECT_EQ(j["params"].size(), 0u);
  EXPECT_NE(RenderMarkdown(*r).find("| divisor |"), std::string::npos);
}

// Issue 20: every string from a trace goes out escaped for its output. These names hold a backtick (it closed
// the code span), a carriage return and a '|' (they ended the table row), raw HTML, and a terminal escape
// sequence (it cleared the screen); the recorded scaling holds raw HTML too.
constexpr char kHostilePrefix[] = "a`b\r|<img src=x onerror=alert(1)>\x1b[2J.";

Report HostileReport() {
  testing::SynthSpec a = Reference(), b = Config(1, 2, 2, "ds-4530", "local-mean");
  a.name_prefix = b.name_prefix = kHostilePrefix;
  b.recorded_scaling = "<svg onload=alert(1)>|x";
  auto r = RunDiff(Synth("hostile-a", a), Synth("hostile-b", b), {});
  EXPECT_TRUE(r.ok()) << r.status().message();
  return std::move(*r);
}

TEST(Reports, MarkdownEscapesEveryStringFromATrace) {
  const std::string m = RenderMarkdown(HostileReport());
  EXPECT_EQ(Count(m, "<img"), 14);  // inside the 14 code spans below, where it is text
  EXPECT_EQ(m.find("<svg"), std::string::npos);
  EXPECT_EQ(m.find('\r'), std::string::npos);
  EXPECT_EQ(m.find('\x1b'), std::string::npos);
  // One row per parameter, its name one code span (fenced past the backtick) that shows it as it is.
  EXPECT_EQ(Count(m, "\n| scaled | ``a`b\\x0d\\|<img src=x onerror=alert(1)>\\x1b[2J."), 14) << m;
  EXPECT_NE(m.find("\n| scaled | ``a`b\\x0d\\|<img src=x onerror=alert(1)>\\x1b[2J.head.weight`` | 1024 | 2 |"),
            std::string::npos);
  EXPECT_NE(m.find("\n| scaling | mean | &lt;svg onload=alert(1)&gt;\\|x |\n"), std::string::npos) << m;
}

// The Markdown outside its code spans (CommonMark: a run of N backticks, not backslash-escaped, opens a span
// that the next run of exactly N closes), where GitHub finds @mentions and issue references.
std::string OutsideCodeSpans(const std::string& md) {
  std::string out;
  for (size_t i = 0; i < md.size();) {
    if (md[i] == '\\' && i + 1 < md.size()) {
      out += md.substr(i, 2);
      i += 2;
      continue;
    }
    if (md[i] != '`') {
      out += md[i++];
      continue;
    }
    const size_t run = std::min(md.find_first_not_of('`', i), md.size()) - i;
    size_t close = i + run;
    for (;;) {
      close = md.find(std::string(run, '`'), close);
      if (close == std::string::npos || std::min(md.find_first_not_of('`', close), md.size()) - close == run) break;
      close = md.find_first_not_of('`', close);
    }
    if (close == std::string::npos) {  // no closing run: the backticks are text
      out += md.substr(i, run);
      i += run;
    } else {
      i = close + run;
    }
  }
  return out;
}

// Issue 20: pasted on GitHub, a name from a trace like '@octocat' pinged the user and 'owner/repo#123'
// cross-referenced the issue. Outside code spans (where GitHub links nothing) '@' and '#' are entities followed
// by a zero-width space; the parameter names stay verbatim in theirs.
TEST(Reports, MarkdownMentionsAndIssueReferencesFromATraceStayInert) {
  Report r = Sp2Report();
  const std::string hostile = "@octocat owner/repo#123 #45";
  r.a.producer = r.b.producer = hostile;
  r.b.config.set_scaling(hostile);
  r.b.config.set_loss("@octocat");
  r.summary = hostile;
  r.groups[0].explanation = hostile;
  r.findings.push_back({"note", hostile});
  r.params[0].name = "@octocat.weight";
  const std::string m = RenderMarkdown(r);
  const std::string text = OutsideCodeSpans(m);
  EXPECT_EQ(text.find('@'), std::string::npos) << text;
  EXPECT_EQ(text.find("#1"), std::string::npos) << text;
  EXPECT_EQ(text.find("#4"), std::string::npos) << text;
  EXPECT_EQ(Count(m, "&#64;&#8203;octocat owner/repo&#35;&#8203;123 &#35;&#8203;45"), 6) << m;
  EXPECT_NE(m.find("| loss | local-mean | &#64;&#8203;octocat |"), std::string::npos) << m;
  EXPECT_NE(m.find("| `@octocat.weight` |"), std::string::npos) << m;
  // The names of a normal report read as they are.
  EXPECT_NE(m.find("| `layers.0.attn.qkv.weight` |"), std::string::npos) << m;
}

TEST(Reports, TextShowsControlBytesFromATraceAsEscapes) {
  const Report r = HostileReport();
  for (bool colour : {false, true}) {
    const std::string t = RenderText(r, colour);
    EXPECT_EQ(t.find('\r'), std::string::npos);
    EXPECT_EQ(t.find("\x1b[2J"), std::string::npos);  // ESC [ 2 J: erase the screen
    EXPECT_EQ(Count(t, "\\x1b[2J."), 14);
  }
  EXPECT_EQ(RenderText(r, false).find('\x1b'), std::string::npos);
}

// Issue 20: a directory named with byte 0xFF, or a rename that cuts a two-byte character, ended in nlohmann's
// uncaught type_error.316 (SIGABRT). Invalid bytes are written as U+FFFD.
TEST(Reports, JsonReplacesInvalidUtf8InPathsAndNames) {
  Report r = Sp2Report();
  r.a.dir = "traces/d\xff";
  r.params[0].name = "\xc3t\xc3\xa9";  // 'ete' with its first two-byte character cut after one byte
  std::string text;
  ASSERT_NO_THROW(text = RenderJson(r));
  const auto j = nlohmann::json::parse(text);
  EXPECT_EQ(j["trace_a"]["dir"], "traces/d\xef\xbf\xbd");
  EXPECT_EQ(j["params"][0]["name"], "\xef\xbf\xbdt\xc3\xa9");
}

TEST(AtomicFile, ReplacesWholeOrLeavesUntouched) {
  std::string dir = testing::FreshDir("out");
  std::filesystem::create_directories(dir);
  std::string path = dir + "/report.json";
  ASSERT_TRUE(WriteFileAtomic(path, "first").ok());
  ASSERT_TRUE(WriteFileAtomic(path, "second").ok());
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), "second");
  Status st = WriteFileAtomic(dir + "/no/such/dir/x.json", "x");
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.message().rfind(dir + "/no/such/dir/x.json: ", 0), 0u) << st.message();
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 1);  // no temp files left
}

}  // namespace
}  // namespace gradtrace::diff

namespace gradtrace::diff {
namespace {

// Regression (found benchmarking as root): `--json /dev/null` renamed a regular
// file over /dev/null. A path that is not a regular file is written in place.
TEST(AtomicFile, DevNullStaysACharacterDevice) {
  ASSERT_TRUE(WriteFileAtomic("/dev/null", "{}\n").ok());
  struct stat st;
  ASSERT_EQ(0, ::stat("/dev/null", &st));
  EXPECT_TRUE(S_ISCHR(st.st_mode));
}

TEST(AtomicFile, RegularFileIsReplacedWhole) {
  const std::string path = ::testing::TempDir() + "/gradtrace_atomic_file.json";
  ASSERT_TRUE(WriteFileAtomic(path, "first, longer content\n").ok());
  ASSERT_TRUE(WriteFileAtomic(path, "second\n").ok());
  std::FILE* f = std::fopen(path.c_str(), "rb");
  ASSERT_NE(nullptr, f);
  char buf[64] = {};
  const size_t n = std::fread(buf, 1, sizeof buf, f);
  std::fclose(f);
  EXPECT_EQ("second\n", std::string(buf, n));
  std::remove(path.c_str());
}

// Config.extra is a protobuf map, which iterates in an order seeded per process: the report's JSON lists it
// sorted by key, so one diff writes the same bytes every run (two runs of one diff wrote two orders before).
TEST(Report, ConfigExtraIsSortedByKey) {
  pb::Config c;
  for (const char* key : {"zeta", "final", "alpha", "zero_reduce_scatter", "m", "b", "y", "c"}) {
    (*c.mutable_extra())[key] = std::string("v-") + key;
  }
  const Json j = ConfigToJson(c);
  std::vector<std::string> keys;
  for (auto it = j.at("extra").begin(); it != j.at("extra").end(); ++it) keys.push_back(it.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"alpha", "b", "c", "final", "m", "y", "zero_reduce_scatter", "zeta"}));
  EXPECT_EQ(j.at("extra").at("final"), "v-final");
}

}  // namespace
}  // namespace gradtrace::diff
