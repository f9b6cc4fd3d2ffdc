// --shard K/N and --merge: the partition, the partial report's round trip, the
// merge's checks, and the contract that matters: the merged report is the
// single-process report, byte for byte and field by field, for N in {1,2,3,5}.
#include "compare/shard.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "compare/diff_engine.h"
#include "compare/merge.h"
#include "report/atomic_file.h"
#include "report/json_io.h"
#include "report/partial_report.h"
#include "test_dirs.h"

namespace gradtrace::diff {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using testing::Config;
using testing::Reference;
using testing::Synth;

TEST(ParseShard, AcceptsKOfN) {
  auto s = ParseShard("4/5");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->k, 4);
  EXPECT_EQ(s->n, 5);
  EXPECT_TRUE(ParseShard("0/1").ok());
}

TEST(ParseShard, RefusesWhatIsNotKOfN) {
  EXPECT_EQ(ParseShard("3/3").status().message(), "--shard 3/3: K must be below N (expected K/N with 0 <= K < N)");
  EXPECT_EQ(ParseShard("0/0").status().message(), "--shard 0/0: N must be at least 1 (expected K/N with 0 <= K < N)");
  for (const char* bad : {"-1/2", "1", "/2", "1/", "a/b", "1/2/3", " 1/2", "1/99999999999"}) {
    auto s = ParseShard(bad);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().message(), std::string("--shard ") + bad + ": not K/N (expected K/N with 0 <= K < N)");
  }
}

TEST(ShardItems, GreedyByWeightIsTheDocumentedPartition) {
  // Decreasing weight to the least-loaded share: 5->0, 4->1, 3->1 (4<5), 3->0 (5<7), 2->1 (7<8), 1->0 (8<9).
  std::vector<int64_t> w = {5, 4, 3, 3, 2, 1};
  EXPECT_EQ(ShardItems(w, {0, 2}), (std::vector<size_t>{0, 3, 5}));
  EXPECT_EQ(ShardItems(w, {1, 2}), (std::vector<size_t>{1, 2, 4}));
  EXPECT_EQ(ShardItems(w, {0, 1}), (std::vector<size_t>{0, 1, 2, 3, 4, 5}));
}

TEST(ShardItems, EveryItemOnceAndLoadsWithinTheLargestItem) {
  std::vector<int64_t> w;
  for (int i = 0; i < 40; ++i) w.push_back((i * 7919) % 1000 + (i % 5 == 0 ? 0 : 1));
  for (int n : {1, 2, 3, 5, 7, 64}) {
    std::vector<int> seen(w.size(), 0);
    int64_t lo = INT64_MAX, hi = 0;
    for (int k = 0; k < n; ++k) {
      int64_t load = 0;
      for (size_t i : ShardItems(w, {k, n})) {
        ++seen[i];
        load += w[i];
      }
      lo = std::min(lo, load);
      hi = std::max(hi, load);
    }
    for (size_t i = 0; i < w.size(); ++i) EXPECT_EQ(seen[i], 1) << "item " << i << " N=" << n;
    EXPECT_LE(hi - lo, *std::max_element(w.begin(), w.end())) << "N=" << n;
  }
}

TEST(Fingerprint, IsFnv1a64InHex) {
  EXPECT_EQ(Fingerprint(""), "cbf29ce484222325");
  EXPECT_EQ(Fingerprint("a"), "af63dc4c8601ec8c");
}

TraceSet Load(const std::string& dir) {
  auto s = TraceSet::Load(dir);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return std::move(*s);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs the N shards as N processes would, each writing part-K.json in `dir`; returns the paths.
std::vector<std::string> WriteParts(const TraceSet& a, const TraceSet& b, const TraceSet* noise, DiffOptions o, int n,
                                    const std::string& dir) {
  fs::create_directories(dir);
  std::vector<std::string> paths;
  for (int k = 0; k < n; ++k) {
    o.shard = {k, n};
    o.bucket_view = k == 0;  // as gradtrace-diff --shard --bucket-views: shard 0 carries the sides' bucket views
    auto c = CompareSets(a, b, o, noise);
    EXPECT_TRUE(c.ok()) << c.status().message();
    if (!c.ok()) return {};
    std::string path = dir + "/part-" + std::to_string(k) + ".json";
    EXPECT_TRUE(WriteFileAtomic(path, RenderPartialJson(*c)).ok());
    paths.push_back(path);
  }
  return paths;
}

// The merged report equals the single-process one: same bytes, same document,
// and (for a readable failure) the same fields one by one. `html`: the merge
// writes HTML (keeps shard 0's bucket views), and the HTML is the same too.
void ExpectMergeEqualsSingle(const Report& single, const std::vector<std::string>& parts, bool html = false) {
  auto merged = MergeParts(parts, html);
  ASSERT_TRUE(merged.ok()) << merged.status().message();
  auto report = JudgeComparison(*merged);
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_EQ(report->ExitCode(), single.ExitCode());
  json m = json::parse(RenderJson(*report)), s = json::parse(RenderJson(single));
  for (auto it = s.begin(); it != s.end(); ++it) {
    if (it.value().is_array() && m[it.key()].is_array() && it.value().size() == m[it.key()].size()) {
      for (size_t i = 0; i < it.value().size(); ++i)
        EXPECT_EQ(m[it.key()][i], it.value()[i]) << it.key() << "[" << i << "]";
    } else {
      EXPECT_EQ(m[it.key()], it.value()) << it.key();
    }
  }
  EXPECT_EQ(m, s);
  EXPECT_EQ(RenderJson(*report), RenderJson(single));
  if (html) {
    EXPECT_EQ(RenderHtml(*report), RenderHtml(single));
  }
}

// #5248 at dp 2 x sp 2 with one scrambled parameter and a rank whose replicas
// disagree: scaled, mismatch and replica findings in one diff.
TEST(ShardMerge, MergedReportEqualsTheSingleProcessReport) {
  TraceSet a = Load(Synth("ref", Reference()));
  auto spec = Config(2, 2, 0, "ds-4530", "local-mean");  // ZeRO-0: every rank a full replica
  spec.scramble = {"head.weight"};
  spec.disagree_rank = 3;
  TraceSet b = Load(Synth("b", spec));
  auto single = DiffSets(a, b, {});
  ASSERT_TRUE(single.ok()) << single.status().message();
  // The single-process answer, in numbers.
  EXPECT_EQ(single->verdict, "mismatch");
  EXPECT_EQ(single->ExitCode(), 1);
  ASSERT_EQ(single->params.size(), 14u);
  ASSERT_GE(single->groups.size(), 2u);
  EXPECT_EQ(single->groups[0].kind, "mismatch");  // most serious first
  EXPECT_NEAR(*single->groups[1].scale, 2.0, 1e-5);
  EXPECT_EQ(single->groups[1].count, 13);
  EXPECT_EQ(single->params[0].name, "head.weight");
  int replica = 0;
  for (const auto& f : single->findings) replica += f.kind == "replica";
  EXPECT_EQ(replica, 14);

  std::string dir = testing::FreshDir("parts");
  for (int n : {1, 2, 3, 5}) {
    SCOPED_TRACE("N=" + std::to_string(n));
    auto parts = WriteParts(a, b, nullptr, {}, n, dir + "/n" + std::to_string(n));
    ASSERT_EQ(parts.size(), size_t(n));
    // Each part holds its share only; together every parameter once, elements balanced.
    size_t params = 0;
    int64_t lo = INT64_MAX, hi = 0;
    for (const auto& path : parts) {
      auto c = ReadPartialJson(path);
      ASSERT_TRUE(c.ok()) << c.status().message();
      EXPECT_EQ(c->param_count, 14u);
      params += c->params.size();
      int64_t elems = 0;
      for (const auto& p : c->params) elems += p.numel;
      lo = std::min(lo, elems);
      hi = std::max(hi, elems);
    }
    EXPECT_EQ(params, 14u);
    EXPECT_LE(hi - lo, 64 * 32);  // the largest parameter (head.weight, 64 x 32)
    // B's reduction evidence is measured once, by shard 1 of N > 1 (A has none to measure: one rank).
    ASSERT_FALSE(single->b.reductions.empty());
    for (int k = 0; k < n; ++k) {
      auto c = ReadPartialJson(parts[k]);
      ASSERT_TRUE(c.ok());
      EXPECT_EQ(c->b.reductions.size(), k == EvidenceShardB(n) ? single->b.reductions.size() : 0u) << k;
    }
    ExpectMergeEqualsSingle(*single, parts);
    std::vector<std::string> reversed(parts.rbegin(), parts.rend());  // order of the files does not matter
    ExpectMergeEqualsSingle(*single, reversed);
  }
}

// --html: the single-process diff computes both sides' bucket views; shard 0
// carries them in its part (the others none), and the merge that writes HTML
// gives the same JSON and HTML bytes. ZeRO-2 on B: cells of partitions.
TEST(ShardMerge, BucketViewsTravelInShardZerosPart) {
  TraceSet a = Load(Synth("a", Config(2, 1, 0, "mean", "local-mean")));
  TraceSet b = Load(Synth("b", Config(2, 2, 2, "ds-4530", "local-mean")));
  DiffOptions o;
  o.bucket_view = true;
  auto single = DiffSets(a, b, o);
  ASSERT_TRUE(single.ok()) << single.status().message();
  ASSERT_FALSE(single->a.bucket_view.empty());
  ASSERT_FALSE(single->b.bucket_view.empty());
  std::string dir = testing::FreshDir("parts");
  for (int n : {1, 2, 3}) {
    SCOPED_TRACE("N=" + std::to_string(n));
    auto parts = WriteParts(a, b, nullptr, {}, n, dir + "/n" + std::to_string(n));
    ASSERT_EQ(parts.size(), size_t(n));
    for (int k = 0; k < n; ++k) {
      auto c = ReadPartialJson(parts[k]);
      ASSERT_TRUE(c.ok()) << c.status().message();
      EXPECT_EQ(c->b.bucket_view.size(), k == 0 ? single->b.bucket_view.size() : 0u) << "shard " << k;
    }
    ExpectMergeEqualsSingle(*single, parts, true);
    ExpectMergeEqualsSingle(*single, std::vector<std::string>(parts.rbegin(), parts.rend()), true);
  }
}

// --noise (a per-parameter tolerance whose fallback is the largest over all
// parameters) and a truncated file (findings from the loaded sets) survive the split.
TEST(ShardMerge, NoiseToleranceAndTruncationMergeExactly) {
  auto ref = Config(2, 1, 0, "mean", "local-mean");
  TraceSet a = Load(Synth("ref", ref));
  ref.split_seed = 99;
  ref.run_id = "ref2";
  TraceSet a2 = Load(Synth("ref2", ref));
  std::string bdir = Synth("b", Config(2, 2, 2, "ds-4530", "local-mean"));
  std::string victim = bdir + "/rank-00001.gtrace";
  ASSERT_TRUE(testing::TruncateFile(victim, fs::file_size(victim) - 300).ok());
  TraceSet b = Load(bdir);
  DiffOptions o;
  o.noise_dir = a2.dir();
  auto single = DiffSets(a, b, o, &a2);
  ASSERT_TRUE(single.ok()) << single.status().message();
  EXPECT_EQ(single->tolerance.source, "noise");
  EXPECT_EQ(single->ExitCode(), 1);
  int truncated = 0;
  for (const auto& f : single->findings) truncated += f.kind == "truncated";
  EXPECT_EQ(truncated, 1);
  std::string dir = testing::FreshDir("parts");
  for (int n : {2, 3, 5}) {
    SCOPED_TRACE("N=" + std::to_string(n));
    ExpectMergeEqualsSingle(*single, WriteParts(a, b, &a2, o, n, dir + "/n" + std::to_string(n)));
  }
}

TEST(ShardMerge, APartIsNotJudgedAlone) {
  TraceSet a = Load(Synth("ref", Reference()));
  TraceSet b = Load(Synth("b", Config(1, 2, 2, "ds-4530", "local-mean")));
  DiffOptions o;
  o.shard = {1, 3};
  auto c = CompareSets(a, b, o);
  ASSERT_TRUE(c.ok());
  auto r = JudgeComparison(*c);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "the comparison holds " + std::to_string(c->params.size()) +
                                      " of 14 parameters (shard 1/3): merge the parts before judging");
}

// Non-finite metrics must come back as they went: a NaN residual and an
// infinite scale judge differently from null.
TEST(PartialReport, RoundTripsNonFiniteNumbersAndEveryField) {
  TraceSet a = Load(Synth("ref", Reference()));
  TraceSet b = Load(Synth("b", Config(2, 1, 0, "mean", "local-mean")));
  auto c = CompareSets(a, b, {});
  ASSERT_TRUE(c.ok());
  c->params[0].metrics.scale = std::numeric_limits<double>::infinity();
  c->params[0].metrics.residual = std::nan("");
  c->params[0].metrics.cosine = -std::numeric_limits<double>::infinity();
  c->params[1].noise_rel_error = 0.1;
  c->params[2].replica[1] = {0.25, 0, 1, "b/rank-00001.gtrace"};
  std::string path = testing::FreshDir("p") + ".json";
  ASSERT_TRUE(WriteFileAtomic(path, RenderPartialJson(*c)).ok());
  auto back = ReadPartialJson(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(RenderPartialJson(*back), RenderPartialJson(*c));
  const Metrics& m = back->params[0].metrics;
  EXPECT_EQ(m.scale, std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(m.residual));
  EXPECT_EQ(m.cosine, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(back->params[1].noise_rel_error, 0.1);
  EXPECT_FALSE(back->params[0].noise_rel_error.has_value());
  EXPECT_EQ(back->params[2].replica[1].other_path, "b/rank-00001.gtrace");
  EXPECT_EQ(back->params[2].replica[1].rel, 0.25);
  EXPECT_EQ(back->a.config.SerializeAsString(), c->a.config.SerializeAsString());
  EXPECT_EQ(back->b.config.SerializeAsString(), c->b.config.SerializeAsString());
  EXPECT_EQ(ReadFile(path).find("\"scale\": \"Infinity\""), ReadFile(path).find("\"scale\": "));
}

class MergeErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = Load(Synth("ref", Reference()));
    b_ = Load(Synth("b", Config(1, 2, 2, "ds-4530", "local-mean")));
    dir_ = testing::FreshDir("parts");
    parts_ = WriteParts(a_, b_, nullptr, {}, 3, dir_);
    ASSERT_EQ(parts_.size(), 3u);
  }
  // The merge fails with exactly `message` (one line).
  void ExpectError(const std::vector<std::string>& paths, const std::string& message) {
    auto m = MergeParts(paths);
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().message(), message);
    EXPECT_EQ(m.status().message().find('\n'), std::string::npos);
  }
  // Part 2 rewritten with `edit` applied to its JSON.
  std::string Edited(const std::function<void(json&)>& edit) {
    json j = json::parse(ReadFile(parts_[2]));
    edit(j);
    std::string path = dir_ + "/edited.json";
    EXPECT_TRUE(WriteFileAtomic(path, j.dump(2)).ok());
    return path;
  }
  TraceSet a_, b_;
  std::string dir_;
  std::vector<std::string> parts_;
};

TEST_F(MergeErrors, AMissingPartIsNamed) {
  ExpectError({parts_[0], parts_[2]}, "--merge: shard 1/3 missing (parts given: " + parts_[0] + ", " + parts_[2] + ")");
}

// Fuzz finding (fuzz_partial_report, crash-6b62d7ce): a number too large for
// a double made nlohmann-json throw out_of_range 406 past the parse_error
// handler, and the merge died of an uncaught exception.
TEST_F(MergeErrors, ANumberTooLargeForADoubleIsAnError) {
  const std::string path = dir_ + "/huge.json";
  ASSERT_TRUE(WriteFileAtomic(path, "{\"param_count\": 1111111111111111010e00000000001783065111111111789968476}").ok());
  ExpectError({path},
              path + ": not JSON: number overflow parsing '1111111111111111010e00000000001783065111111111789968476'");
}

// Fuzz finding (fuzz_partial_report): a part that lost a parameter was
// reported by count only ("parts given: 1"), naming no file.
TEST_F(MergeErrors, AParameterInNoPartNamesTheParts) {
  const std::string edited = Edited([](json& j) { j["params"].erase(j["params"].begin()); });
  const int64_t index = json::parse(ReadFile(parts_[2]))["params"][0]["index"];
  const int64_t count = json::parse(ReadFile(parts_[2]))["param_count"];
  ExpectError({parts_[0], parts_[1], edited}, "--merge: parameter index " + std::to_string(index) + " of " +
                                                  std::to_string(count) + " is in no part (parts given: " + parts_[0] +
                                                  ", " + parts_[1] + ", " + edited + ")");
}

TEST_F(MergeErrors, ADuplicatePartIsNamed) {
  fs::copy_file(parts_[1], dir_ + "/copy.json");
  ExpectError({parts_[0], parts_[1], dir_ + "/copy.json", parts_[2]},
              dir_ + "/copy.json: shard 1/3 given twice (also " + parts_[1] + ")");
}

TEST_F(MergeErrors, APartOfAnotherDiffIsRefused) {
  TraceSet other = Load(Synth("other", Config(1, 4, 2, "ds-4530", "local-mean")));
  auto foreign = WriteParts(a_, other, nullptr, {}, 3, dir_ + "/foreign");
  auto mine = ReadPartialJson(parts_[0]);
  auto theirs = ReadPartialJson(foreign[1]);
  ASSERT_TRUE(mine.ok() && theirs.ok());
  EXPECT_NE(mine->fingerprint, theirs->fingerprint);
  ExpectError({parts_[0], foreign[1], parts_[2]}, foreign[1] + ": a part of a different diff (inputs fingerprint " +
                                                      theirs->fingerprint + ", " + parts_[0] + " has " +
                                                      mine->fingerprint + ")");
  // Different options over the same traces are a different diff too.
  DiffOptions o;
  o.rtol = 0.5;
  auto loose = WriteParts(a_, b_, nullptr, o, 3, dir_ + "/loose");
  EXPECT_FALSE(MergeParts({parts_[0], loose[1], parts_[2]}).ok());
}

// Nodes may mount the traces at different paths: the fingerprint leaves the
// directories out, and the merged report names shard 0's.
TEST_F(MergeErrors, TheSameTracesElsewhereAreTheSameDiff) {
  std::string copy = dir_ + "/elsewhere";
  fs::copy(b_.dir(), copy);
  TraceSet moved = Load(copy);
  auto elsewhere = WriteParts(a_, moved, nullptr, {}, 3, dir_ + "/node2");
  auto merged = MergeParts({elsewhere[1], parts_[2], parts_[0]});
  ASSERT_TRUE(merged.ok()) << merged.status().message();
  EXPECT_EQ(merged->b.dir, b_.dir());
  auto single = DiffSets(a_, b_, {});
  auto report = JudgeComparison(*merged);
  ASSERT_TRUE(single.ok() && report.ok());
  EXPECT_EQ(RenderJson(*report), RenderJson(*single));
}

TEST_F(MergeErrors, PartsOfDifferentNAreRefused) {
  auto halves = WriteParts(a_, b_, nullptr, {}, 2, dir_ + "/halves");
  ExpectError({parts_[0], halves[1], parts_[2]},
              halves[1] + ": shard 1/2, but " + parts_[0] + " is shard 0/3 (all parts must come from one N)");
}

TEST_F(MergeErrors, MalformedFilesAreOneLineNamingTheFile) {
  std::string cut = dir_ + "/cut.json";
  std::string text = ReadFile(parts_[2]);
  ASSERT_TRUE(WriteFileAtomic(cut, text.substr(0, text.size() / 2)).ok());
  auto m = MergeParts({parts_[0], parts_[1], cut});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message().rfind(cut + ": not JSON: parse error at line ", 0), 0u) << m.status().message();

  ExpectError({parts_[0], parts_[1], dir_ + "/absent.json"},
              dir_ + "/absent.json: cannot open: No such file or directory");
  std::string path = Edited([](json& j) { j["params"][0]["scale"] = "two"; });
  ExpectError({parts_[0], parts_[1], path},
              path +
                  ": not a gradtrace-diff partial report: params[0].scale: expected a number, \"NaN\", "
                  "\"Infinity\" or \"-Infinity\", found \"two\"");
  path = Edited([](json& j) { j["params"][0].erase("replicas"); });
  ExpectError({parts_[0], parts_[1], path},
              path + ": not a gradtrace-diff partial report: params[0].replicas: missing");
  path = Edited([](json& j) { j["kind"] = "report"; });
  ExpectError({parts_[0], parts_[1], path},
              path + ": not a gradtrace-diff partial report: kind: 'report', expected 'partial'");
  path = Edited([](json& j) { j["schema_version"] = "2.0"; });
  ExpectError({parts_[0], parts_[1], path},
              path + ": not a gradtrace-diff partial report: schema_version: '2.0' (this gradtrace-diff reads 1.x)");
  path = Edited([](json& j) { j = json::array(); });
  ExpectError({parts_[0], parts_[1], path},
              path + ": not a gradtrace-diff partial report: top level: expected an object");
  // A config key with a line break in it: protobuf's message quotes it (fuzz_partial_report found it at 3dcc308).
  path = Edited([](json& j) { j["config_b"]["back\nd"] = 1; });
  {
    auto m = MergeParts({parts_[0], parts_[1], path});
    ASSERT_FALSE(m.ok());
    const std::string& message = m.status().message();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_EQ(message.rfind(path + ": not a gradtrace-diff partial report: config_b: config: ", 0), 0u) << message;
    EXPECT_NE(message.find("back\\x0ad"), std::string::npos) << message;
  }

  // A full report is not a part.
  auto single = DiffSets(a_, b_, {});
  ASSERT_TRUE(single.ok());
  std::string full = dir_ + "/full.json";
  ASSERT_TRUE(WriteFileAtomic(full, RenderJson(*single)).ok());
  ExpectError({full}, full +
                          ": not a gradtrace-diff partial report: kind: missing: this is a full report; --merge "
                          "reads the files --shard K/N --json wrote");
}

// Issue 20: --merge crashed on crafted partial reports. Each is now one line naming the file, with nothing
// allocated from a count the file states.
TEST_F(MergeErrors, DeepNestingIsRefusedBeforeParsing) {
  // 50,000 nested arrays overflowed the stack (SIGSEGV).
  const std::string path = dir_ + "/deep.json";
  ASSERT_TRUE(WriteFileAtomic(path, std::string(50000, '[') + std::string(50000, ']')).ok());
  ExpectError({parts_[0], parts_[1], path}, path + ": nested deeper than 64 arrays and objects (byte 64)");
  // Brackets in a string are text, not nesting.
  const std::string quoted = Edited([](json& j) { j["notes"].push_back(std::string(1000, '[')); });
  EXPECT_TRUE(MergeParts({parts_[0], parts_[1], quoted}).ok());
}

// Issue 42: a key given twice was accepted, the last one winning (in a pack.json it switched the diff mode
// silently): every JSON a command reads refuses it in one line, naming the key (escaped: it comes from the file).
TEST_F(MergeErrors, AKeyGivenTwiceIsRefused) {
  std::string text = ReadFile(parts_[2]);
  ASSERT_EQ(text.front(), '{');
  const std::string path = dir_ + "/twice.json";
  ASSERT_TRUE(WriteFileAtomic(path, "{\"kind\": \"x\", " + text.substr(1)).ok());
  ExpectError({parts_[0], parts_[1], path}, path + ": key \"kind\" given twice in one object");
  ASSERT_TRUE(WriteFileAtomic(path, "{\"a\": {\"k\\nx\": 1, \"k\\nx\": 2}}").ok());
  auto m = MergeParts({parts_[0], parts_[1], path});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message().find('\n'), std::string::npos) << m.status().message();
  // The same key in two objects is no duplicate.
  ASSERT_TRUE(WriteFileAtomic(path, "[{\"k\": 1}, {\"k\": 2}]").ok());
  auto other = MergeParts({parts_[0], parts_[1], path});
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().message().find("given twice"), std::string::npos) << other.status().message();
}

// Issue 42: a rank of 2^40 was cast to an int and the cell or replica ignored silently. Ranks must lie in the
// side's world, counts in their range; each is refused in one line naming the field.
TEST_F(MergeErrors, OutOfRangeRanksAreRefused) {
  const int64_t huge = int64_t{1} << 40;
  std::string path = Edited([&](json& j) { j["params"][0]["replicas"][1]["other"] = huge; });
  std::string world = std::to_string(json::parse(ReadFile(parts_[0]))["trace_b"]["world"].get<int>());
  ExpectError({parts_[0], parts_[1], path}, path +
                                                ": not a gradtrace-diff partial report: params[0].replicas[1].other: "
                                                "1099511627776 is outside -1.." +
                                                std::to_string(std::stoi(world) - 1));
  path = Edited([&](json& j) { j["trace_b"]["bucket_view"] = json::array({json{{"rank", huge}}}); });
  ExpectError({parts_[0], parts_[1], path}, path +
                                                ": not a gradtrace-diff partial report: trace_b.bucket_view[0].rank: "
                                                "1099511627776 is outside 0.." +
                                                std::to_string(std::stoi(world) - 1));
  path = Edited([&](json& j) { j["trace_b"]["bucket_view"] = json::array({json{{"rank", std::stoi(world)}}}); });
  ExpectError({parts_[0], parts_[1], path},
              path + ": not a gradtrace-diff partial report: trace_b.bucket_view[0].rank: " + world +
                  " is outside 0.." + std::to_string(std::stoi(world) - 1));
  path = Edited([&](json& j) { j["trace_a"]["world"] = huge; });
  ExpectError({parts_[0], parts_[1], path},
              path + ": not a gradtrace-diff partial report: trace_a.world: 1099511627776 is outside 1..2147483647");
}

TEST_F(MergeErrors, AHugeShardCountAllocatesNothing) {
  // shard.n = 2^31-1 sized a vector of n entries before any check: bad_alloc, SIGABRT.
  const std::string path = Edited([](json& j) { j["shard"] = {{"k", 2}, {"n", 2147483647}}; });
  ExpectError({path}, "--merge: shard 0/2147483647 missing (parts given: " + path + ")");
  const std::string beyond = Edited([](json& j) { j["shard"] = {{"k", 2}, {"n", 2147483648}}; });
  ExpectError({beyond}, beyond + ": not a gradtrace-diff partial report: shard: 2/2147483648 is not K/N");
}

TEST_F(MergeErrors, AHugeParameterCountAllocatesNothing) {
  // param_count = 1e9 sized a vector of 1e9 entries before any check: bad_alloc, SIGABRT.
  size_t given = 0;
  for (const std::string& part : parts_) given += json::parse(ReadFile(part))["params"].size();
  json j = json::parse(ReadFile(parts_[0]));  // the merged report takes shard 0's count
  j["param_count"] = 1000000000;
  const std::string first = dir_ + "/count.json";
  ASSERT_TRUE(WriteFileAtomic(first, j.dump(2)).ok());
  ExpectError({first, parts_[1], parts_[2]}, "--merge: parameter index " + std::to_string(given) +
                                                 " of 1000000000 is in no part (parts given: " + first + ", " +
                                                 parts_[1] + ", " + parts_[2] + ")");
}

TEST_F(MergeErrors, AHugeStringIsRefusedBeforeParsing) {
  // A 190 MB string cost 1.37 GB; no string gradtrace writes comes near kMaxJsonString (1 MiB).
  const std::string path = Edited([](json& j) { j["noise_dir"] = std::string(kMaxJsonString + 1, 'x'); });
  const size_t at = ReadFile(path).find("\"xxx");
  ExpectError({parts_[0], parts_[1], path},
              path + ": string longer than 1048576 bytes (byte " + std::to_string(at) + ")");
  const std::string fits = Edited([](json& j) { j["noise_dir"] = std::string(kMaxJsonString, 'x'); });
  EXPECT_TRUE(ReadPartialJson(fits).ok());
}

TEST_F(MergeErrors, AFifoIsRefusedWithoutBlocking) {
  // A FIFO blocked the read in open() until some process opened it for writing: forever.
  const std::string fifo = dir_ + "/part-fifo.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ::alarm(20);  // a regression fails (SIGALRM) instead of hanging
  ExpectError({parts_[0], parts_[1], fifo}, fifo + ": not a regular file (a FIFO)");
  ::alarm(0);
}

TEST_F(MergeErrors, AParameterInTwoPartsIsRefused) {
  // Part 2 claims a parameter of part 0 (same fingerprint: a hand-edited or buggy part).
  json p0 = json::parse(ReadFile(parts_[0]));
  std::string path = Edited([&](json& j) { j["params"].push_back(p0["params"][0]); });
  std::string name = p0["params"][0]["name"];
  ExpectError({parts_[0], parts_[1], path}, path + ": parameter '" + name + "' (index " +
                                                std::to_string(p0["params"][0]["index"].get<int>()) + ") also in " +
                                                parts_[0]);
}

}  // namespace
}  // namespace gradtrace::diff
