// Issue 24 item 1: units in the FINAL/POST layout are compared straight from
// the frames (stream_compare.h). Each case checks which layouts the walk takes
// (CompareStreamed on one unit of every parameter) and that a diff gives the
// same report, bit for bit, streamed or reassembled (DiffOptions.stream), as
// FullSums' blocks promise; what the walk leaves (partitions, replicas that
// disagree, corrupt frames) goes to reassembly with the same answers and errors.
#include "compare/stream_compare.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "compare/diff_engine.h"
#include "synth_big.h"
#include "synth_trace.h"
#include "test_dirs.h"
#include "trace_reader.h"

namespace gradtrace::diff {
namespace {
namespace fs = std::filesystem;
using testing::Config;
using testing::Reference;
using testing::Synth;

// CompareStreamed on one unit holding every comparable parameter of the two sets at `phase`.
bool Streams(const std::string& a, const std::string& b, pb::Phase phase, std::vector<StreamedParam>* out,
             Alignment* al) {
  auto x = TraceSet::Load(a), y = TraceSet::Load(b);
  EXPECT_TRUE(x.ok() && y.ok());
  if (!x.ok() || !y.ok()) return false;
  auto aligned = AlignSets(*x, *y, {}, phase, std::nullopt);
  EXPECT_TRUE(aligned.ok()) << aligned.status().message();
  if (!aligned.ok()) return false;
  *al = *aligned;
  std::vector<size_t> pairs;
  for (size_t i = 0; i < al->params.size(); ++i) {
    if (al->params[i].problem.empty()) pairs.push_back(i);
  }
  const Selection sel{al->step, phase};
  ReaderCache readers;
  StreamCache cache;
  return CompareStreamed(*x, *y, SelectFrames(*x, sel), SelectFrames(*y, sel), *al, pairs, &readers, &cache, out);
}

bool Streams(const std::string& a, const std::string& b, pb::Phase phase = pb::FINAL) {
  std::vector<StreamedParam> out;
  Alignment al;
  return Streams(a, b, phase, &out, &al);
}

// The JSON report of a diff, streamed or not (and with other options).
std::string Diff(const std::string& a, const std::string& b, bool stream, DiffOptions o = {}) {
  o.stream = stream;
  auto r = RunDiff(a, b, o);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? RenderJson(*r) : "";
}

void ExpectSameReports(const std::string& a, const std::string& b, DiffOptions o = {}) {
  const std::string streamed = Diff(a, b, true, o);
  EXPECT_FALSE(streamed.empty());
  EXPECT_EQ(streamed, Diff(a, b, false, o));
}

// `text` with every `from` replaced by `to` (a report of one synth directory read as another's).
std::string Replaced(std::string text, const std::string& from, const std::string& to) {
  for (size_t at; (at = text.find(from)) != std::string::npos;) text.replace(at, from.size(), to);
  return text;
}

// A's one rank against B's `ranks` replicas that agree, each parameter streamed and counted as the replica merge
// counts them.
void ExpectStreamedReplicas(const std::string& a, const std::string& b, int ranks) {
  std::vector<StreamedParam> out;
  Alignment al;
  ASSERT_TRUE(Streams(a, b, pb::FINAL, &out, &al));
  ASSERT_FALSE(out.empty());
  for (const StreamedParam& p : out) {
    EXPECT_EQ(p.a.ranks, 1);
    EXPECT_EQ(p.b.ranks, ranks);
    EXPECT_EQ(p.b.replica_rank, 0);
    EXPECT_EQ(p.b.replica_rel(), 0);
    EXPECT_EQ(p.b.covered, p.b.numel);
  }
}

// One rank against three replicas, every frame the same bytes on each rank: streamed, with the whole path's
// report; the replicas are counted as the replica merge counts them.
TEST(StreamCompare, ReplicasThatAgreeAreStreamed) {
  const std::string a = Synth("stream-ref", Reference());
  testing::SynthSpec spec = Config(3, 1, 0, "mean", "local-mean");
  spec.extra_factor["layers.0.mlp.fc1.weight"] = 4;
  const std::string b = Synth("stream-dp3", spec);
  ExpectStreamedReplicas(a, b, 3);
  ExpectSameReports(a, b);
  auto r = RunDiff(a, b, {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->verdict, "scaled") << r->summary;
  for (const ParamResult& p : r->params) {
    EXPECT_NEAR(p.metrics.scale, p.name == "layers.0.mlp.fc1.weight" ? 4.0 : 1.0, 1e-6) << p.name;  // fp32 sums
  }
}

// A parameter of three million elements cut across frames (and so across the walk's blocks), two replicas per side:
// streamed; the scale is exact and all three paths (streamed, whole, windowed) give the same report.
TEST(StreamCompare, AParameterAcrossFramesIsStreamedBlockByBlock) {
  const auto [a, b] = testing::BigParamPair("stream-big", 3'000'000, 2);
  std::vector<StreamedParam> out;
  Alignment al;
  ASSERT_TRUE(Streams(a, b, pb::FINAL, &out, &al));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].metrics.scale, 2.0);
  EXPECT_EQ(out[0].metrics.residual, 0.0);
  EXPECT_EQ(out[0].metrics.compared, 3'000'000);
  DiffOptions windows;
  windows.window_elements = 1 << 20;
  const std::string streamed = Diff(a, b, true);
  EXPECT_EQ(streamed, Diff(a, b, false));
  EXPECT_EQ(streamed, Diff(a, b, false, windows));
  DiffOptions one_thread;
  one_thread.threads = 1;
  EXPECT_EQ(streamed, Diff(a, b, true, one_thread));
}

// Layouts the walk leaves to reassembly, with the same reports: ZeRO-2 partitions (POST), pre-reduce sums, sketch
// and stats capture.
TEST(StreamCompare, OtherLayoutsAreReassembledWithTheSameAnswers) {
  const std::string ref = Synth("stream-ref", Reference());
  const std::string zero2 = Synth("stream-zero2", Config(3, 1, 2, "mean", "local-mean"));
  EXPECT_FALSE(Streams(zero2, Synth("stream-zero2-dp4", Config(4, 1, 2, "mean", "local-mean")), pb::POST_REDUCE));
  DiffOptions post;
  post.phase = pb::POST_REDUCE;
  ExpectSameReports(zero2, Synth("stream-zero2-dp4", Config(4, 1, 2, "mean", "local-mean")), post);
  DiffOptions pre;
  pre.phase = pb::PRE_REDUCE;
  ExpectSameReports(ref, Synth("stream-sp2", Config(2, 2, 0, "ds-4530", "local-mean")), pre);
  for (const std::string capture : {"sketch:64", "stats"}) {
    testing::SynthSpec spec = Reference();
    spec.capture = capture;
    const std::string other = Synth("stream-" + capture.substr(0, 5), spec);
    EXPECT_FALSE(Streams(ref, other)) << capture;
    ExpectSameReports(ref, other);
  }
}

// A side cut short (rank 1's file truncated in the middle): what it lacks is missing data, the same notes streamed
// or not.
TEST(StreamCompare, ATruncatedSideGivesTheSameCoverageNotes) {
  const std::string a = Synth("stream-ref", Reference());
  const std::string b = Synth("stream-cut", Config(2, 1, 0, "mean", "local-mean"));
  const fs::path rank1 = fs::path(b) / "rank-00001.gtrace";
  ASSERT_TRUE(testing::TruncateFile(rank1.string(), fs::file_size(rank1) / 2).ok());
  ExpectSameReports(a, b);
  auto r = RunDiff(a, b, {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FALSE(r->a.truncated);
  EXPECT_TRUE(r->b.truncated);
}

// A replica whose FINAL differs is not the first rank's bytes: the unit is reassembled and the disagreement found.
TEST(StreamCompare, ReplicasThatDisagreeAreReassembledAndReported) {
  const std::string a = Synth("stream-ref", Reference());
  testing::SynthSpec spec = Config(3, 1, 0, "mean", "local-mean");
  spec.disagree_rank = 2;
  const std::string b = Synth("stream-disagree", spec);
  EXPECT_FALSE(Streams(a, b));
  ExpectSameReports(a, b);
  auto r = RunDiff(a, b, {});
  ASSERT_TRUE(r.ok());
  bool found = false;
  for (const Finding& f : r->findings) found |= f.kind == "replica" && f.message.find("rank 2") != std::string::npos;
  EXPECT_TRUE(found) << r->summary;
}

// Format 1.6: each rank's FINAL a reference to its own PRE_REDUCE frames (a reduction that never happened). The
// ranks' FINAL frames are then byte for byte the same while their values are not: not copies, so not streamed,
// and the replicas found to disagree, as when the same values are written in full.
TEST(StreamCompare, ReferencesToDifferentValuesAreNotCopies) {
  const std::string a = Synth("stream-ref", Reference());
  testing::SynthSpec spec = Config(3, 1, 0, "mean", "local-mean");
  spec.final_from_pre = "reference";
  const std::string refs = Synth("stream-final-refs", spec);
  spec.final_from_pre = "full";
  const std::string full = Synth("stream-final-full", spec);
  // The case at hand: rank 1's FINAL frames are byte for byte rank 0's (the references), their values not.
  auto r0 = TraceReader::Open(refs + "/rank-00000.gtrace"), r1 = TraceReader::Open(refs + "/rank-00001.gtrace");
  ASSERT_TRUE(r0.ok() && r1.ok());
  constexpr auto kBucket = static_cast<uint32_t>(format::FrameType::kBucketRecord);
  int same = 0;
  for (const pb::IndexEntry& e : (*r0)->index().entries()) {
    if (e.type() != kBucket || e.phase() != pb::FINAL) continue;
    TraceReader::StoredFrame x, y;
    ASSERT_TRUE((*r0)->ReadStoredAt(e.offset(), &x).ok());
    for (const pb::IndexEntry& g : (*r1)->index().entries()) {
      if (g.type() == kBucket && g.phase() == pb::FINAL && g.bucket_id() == e.bucket_id()) {
        same += (*r1)->ReadStoredAt(g.offset(), &y).ok() && x.SameBytes(y);
      }
    }
  }
  ASSERT_GT(same, 0);
  EXPECT_FALSE(Streams(a, refs));
  EXPECT_FALSE(Streams(a, full));
  ExpectSameReports(a, refs);
  // Reassembled (the path that finds copies by their bytes, ReaderCache) and streamed, with and without bucket
  // views: every parameter's answer and note, and every finding, as when the values are written in full.
  auto same_dir = [](const std::string& text) { return Replaced(text, "stream-final-refs", "stream-final-full"); };
  for (bool stream : {false, true}) {
    for (bool views : {false, true}) {
      SCOPED_TRACE(std::string(stream ? "streamed" : "reassembled") + (views ? ", bucket views" : ""));
      DiffOptions o;
      o.stream = stream;
      o.bucket_view = views;
      auto r = RunDiff(a, refs, o), f = RunDiff(a, full, o);
      ASSERT_TRUE(r.ok() && f.ok());
      EXPECT_EQ(r->summary, f->summary);
      ASSERT_EQ(r->params.size(), f->params.size());
      for (size_t i = 0; i < r->params.size(); ++i) {
        EXPECT_EQ(r->params[i].name, f->params[i].name);
        EXPECT_EQ(same_dir(r->params[i].note), f->params[i].note) << r->params[i].name;
        EXPECT_EQ(r->params[i].verdict, f->params[i].verdict) << r->params[i].name;
      }
      ASSERT_EQ(r->findings.size(), f->findings.size());
      int replicas = 0;
      for (size_t i = 0; i < r->findings.size(); ++i) {
        EXPECT_EQ(r->findings[i].kind, f->findings[i].kind);
        EXPECT_EQ(same_dir(r->findings[i].message), f->findings[i].message);
        replicas += r->findings[i].kind == "replica";
      }
      EXPECT_GT(replicas, 0) << r->summary;
    }
  }
}

// Format 1.6 as the capture writes it: each rank's FINAL a reference to its own POST_REDUCE frames, which hold the
// same values on every rank. The references differ where their targets are (each rank's file has offsets of its
// own), the values they name do not: copies, streamed, with the report of the same values written in full.
TEST(StreamCompare, ReplicasReferencesToTheirOwnOffsetsAreCopies) {
  const std::string a = Synth("stream-ref", Reference());
  testing::SynthSpec spec = Config(3, 1, 0, "mean", "local-mean");
  const std::string full = Synth("stream-post-full", spec);
  spec.final_by_reference = true;
  const std::string refs = Synth("stream-post-refs", spec);
  std::vector<std::set<uint64_t>> from(3);
  for (int r = 0; r < 3; ++r) {
    auto reader = TraceReader::Open(refs + "/rank-0000" + std::to_string(r) + ".gtrace");
    ASSERT_TRUE(reader.ok());
    for (const pb::IndexEntry& e : (*reader)->index().entries()) {
      if (e.type() != static_cast<uint32_t>(format::FrameType::kBucketRecord) || e.phase() != pb::FINAL) continue;
      RecordView v;
      ASSERT_TRUE((*reader)->ReadView(e.offset(), &v).ok());
      EXPECT_NE(v.record().values_from(), 0u);
      from[r].insert(v.record().values_from());
    }
  }
  ASSERT_FALSE(from[0].empty());
  EXPECT_NE(from[0], from[1]);
  EXPECT_NE(from[0], from[2]);
  ExpectStreamedReplicas(a, refs, 3);
  for (bool stream : {true, false}) {
    SCOPED_TRACE(stream ? "streamed" : "reassembled");
    const std::string r = Diff(a, refs, stream), f = Diff(a, full, stream);
    EXPECT_FALSE(f.empty());
    EXPECT_EQ(Replaced(r, "stream-post-refs", "stream-post-full"), f);
  }
}

// A corrupt frame (one byte of the first rank's last FINAL frame): the walk gives up, reassembly reports it in its
// words, naming the file, as a diff without streaming does.
TEST(StreamCompare, ACorruptFrameIsReportedByReassembly) {
  const std::string a = Synth("stream-ref", Reference());
  const std::string b = Synth("stream-corrupt", Config(2, 1, 0, "mean", "local-mean"));
  std::string path0;
  uint64_t at = 0;
  {
    auto set = TraceSet::Load(b);
    ASSERT_TRUE(set.ok()) << set.status().message();
    const auto frames = SelectFrames(*set, {0, pb::FINAL});
    path0 = set->ranks()[0].path;
    at = frames[0].back()->offset + format::kFrameHeaderSize + 10;
  }
  ASSERT_TRUE(testing::FlipByte(path0, at).ok());
  EXPECT_FALSE(Streams(a, b));
  DiffOptions o;
  auto streamed = RunDiff(a, b, o);
  o.stream = false;
  auto whole = RunDiff(a, b, o);
  ASSERT_FALSE(streamed.ok());
  ASSERT_FALSE(whole.ok());
  EXPECT_EQ(streamed.status().message(), whole.status().message());
  EXPECT_NE(streamed.status().message().find(path0), std::string::npos) << streamed.status().message();
}

}  // namespace
}  // namespace gradtrace::diff
