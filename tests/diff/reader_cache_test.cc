// Issue 24 item 1: the gatherer decodes each distinct frame once. Replicas
// (FINAL of data parallel ranks) write byte-identical frames, which ReaderCache
// reads and compares instead of decompressing again; a frame at the cut between
// two work units is kept for the next unit; ParallelForBlocks hands each thread
// a run of neighbouring units. The answers must be those of gathering without
// any cache (budget 0), and a frame that differs by one byte is decoded (and
// its corruption reported) as before.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>

#include "dtype.h"
#include "load/gather.h"
#include "load/thread_pool.h"
#include "test_dirs.h"

namespace gradtrace::diff {
namespace {
using testing::Synth;

std::vector<int32_t> AllIds(const TraceSet& set) {
  std::vector<int32_t> ids;
  for (int i = 0; i < set.run().params_size(); ++i) ids.push_back(i);
  return ids;
}

// The same gradients, replica statistics included, bit for bit.
void ExpectSameValues(const std::vector<SideValues>& x, const std::vector<SideValues>& y) {
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(x[i].numel, y[i].numel) << i;
    ASSERT_EQ(x[i].covered, y[i].covered) << i;
    for (int64_t e = 0; e < x[i].numel; ++e) ASSERT_EQ(x[i].at(e), y[i].at(e)) << i << " " << e;
    EXPECT_EQ(x[i].replica_diff2, y[i].replica_diff2) << i;
    EXPECT_EQ(x[i].replica_elems, y[i].replica_elems) << i;
    EXPECT_EQ(x[i].replica_worst, y[i].replica_worst) << i;
    EXPECT_EQ(x[i].replica_other, y[i].replica_other) << i;
    EXPECT_EQ(x[i].ranks, y[i].ranks) << i;
  }
}

// A dp4 set's FINAL gathered with the cache and without: rank 0's frames decoded, ranks 1-3's found to be copies.
void ExpectReplicasDecodedOnce(const std::string& name, const testing::SynthSpec& spec) {
  auto set = TraceSet::Load(Synth(name, spec));
  ASSERT_TRUE(set.ok()) << set.status().message();
  const auto frames = SelectFrames(*set, {0, pb::FINAL});
  ASSERT_GT(frames[0].size(), 1u);
  ReaderCache cache, none(0);
  std::vector<SideValues> cached, decoded;
  ASSERT_TRUE(GatherParams(*set, frames, AllIds(*set), Combine::kReplicas, &cache, &cached).ok());
  ASSERT_TRUE(GatherParams(*set, frames, AllIds(*set), Combine::kReplicas, &none, &decoded).ok());
  EXPECT_EQ(cache.decoded(), frames[0].size());
  EXPECT_EQ(cache.deduplicated(), 3 * frames[0].size());
  EXPECT_EQ(none.decoded(), 4 * frames[0].size());
  EXPECT_EQ(none.deduplicated(), 0u);
  ExpectSameValues(cached, decoded);
  for (const SideValues& v : cached) EXPECT_EQ(v.replica_worst, 0.0);
}

// Ranks 1-3 wrote the same bytes as rank 0.
TEST(ReaderCache, ReplicaFramesAreDecodedOnce) {
  ExpectReplicasDecodedOnce("dp4", testing::Config(4, 1, 0, "mean", "local-mean"));
}

// Format 1.6: replicas' FINAL frames are references to their own POST_REDUCE frames, at offsets of each rank's own.
// They are found to be copies by what they name.
TEST(ReaderCache, ReplicasReferencesAreDecodedOnce) {
  testing::SynthSpec spec = testing::Config(4, 1, 0, "mean", "local-mean");
  spec.final_by_reference = true;
  ExpectReplicasDecodedOnce("dp4-post-refs", spec);
}

// A replica that disagrees writes other bytes: its frames are decoded and the disagreement measured as before.
TEST(ReaderCache, ADisagreeingReplicaIsDecodedAndMeasured) {
  testing::SynthSpec spec = testing::Config(4, 1, 0, "mean", "local-mean");
  spec.disagree_rank = 2;
  auto set = TraceSet::Load(Synth("dp4", spec));
  ASSERT_TRUE(set.ok()) << set.status().message();
  const auto frames = SelectFrames(*set, {0, pb::FINAL});
  ReaderCache cache, none(0);
  std::vector<SideValues> cached, decoded;
  ASSERT_TRUE(GatherParams(*set, frames, AllIds(*set), Combine::kReplicas, &cache, &cached).ok());
  ASSERT_TRUE(GatherParams(*set, frames, AllIds(*set), Combine::kReplicas, &none, &decoded).ok());
  EXPECT_EQ(cache.decoded(), frames[0].size() + frames[2].size());
  EXPECT_EQ(cache.deduplicated(), frames[1].size() + frames[3].size());
  ExpectSameValues(cached, decoded);
  double worst = 0;
  for (const SideValues& v : cached) {
    worst = std::max(worst, v.replica_worst);
    if (v.replica_worst > 0) {
      EXPECT_EQ(v.replica_other, 2);
    }
  }
  EXPECT_GT(worst, 1e-3);
}

// One byte flipped in rank 1's copy of a frame: not rank 0's bytes, so it is decoded, and its CRC names the file.
TEST(ReaderCache, ACorruptReplicaIsDecodedAndReported) {
  testing::SynthSpec spec = testing::Config(2, 1, 0, "mean", "local-mean");
  const std::string dir = Synth("dp2", spec);
  std::string path1;
  uint64_t at = 0;
  {
    auto set = TraceSet::Load(dir);
    ASSERT_TRUE(set.ok()) << set.status().message();
    const auto frames = SelectFrames(*set, {0, pb::FINAL});
    path1 = set->ranks()[1].path;
    at = frames[1].back()->offset + format::kFrameHeaderSize + 10;
  }
  ASSERT_TRUE(testing::FlipByte(path1, at).ok());
  auto set = TraceSet::Load(dir);
  ASSERT_TRUE(set.ok()) << set.status().message();
  const auto frames = SelectFrames(*set, {0, pb::FINAL});
  ReaderCache cache;
  std::vector<SideValues> out;
  Status st = GatherParams(*set, frames, AllIds(*set), Combine::kReplicas, &cache, &out);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_NE(st.message().find(path1), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("checksum mismatch"), std::string::npos) << st.message();
}

// The last FINAL frame of rank 0 holding two parameters or more (null: none).
const FrameRef* FrameOfTwo(const TraceSet& set) {
  const FrameRef* f = nullptr;
  const auto frames = SelectFrames(set, {0, pb::FINAL});
  for (const FrameRef* x : frames[0]) {
    if (x->param_ids.size() >= 2) f = x;
  }
  return f;
}

// A frame holding parameters of units 0 and 1 is decoded in unit 0 and served from the cache in unit 1, its
// bytes viewed (both parameters' there); a unit after the last that reads it finds it gone.
TEST(ReaderCache, AFrameAtACutServesTheNextUnit) {
  auto set = TraceSet::Load(Synth("one", testing::Reference()));
  ASSERT_TRUE(set.ok()) << set.status().message();
  const FrameRef* f = FrameOfTwo(*set);
  ASSERT_NE(f, nullptr);
  const int32_t early = f->param_ids[0], late = f->param_ids[1];
  std::vector<int> plan(set->run().params_size(), -1);
  plan[early] = 0;
  plan[late] = 1;
  ReaderCache cache;
  cache.Plan(*set, plan);
  cache.BeginUnit(0);
  auto first = cache.Bucket(*set, *f, true);
  ASSERT_TRUE(first.ok()) << first.status().message();
  // The bytes of parameter `id`'s full slice in the frame (0 when it has none).
  auto full_bytes = [&](const RecordView* frame, int32_t id) -> size_t {
    const auto& slices = frame->record().slices();
    for (int i = 0; i < slices.size(); ++i) {
      if (slices[i].param_id() == id && slices[i].has_full()) return frame->data(i).size();
    }
    return 0;
  };
  const size_t bytes_of = static_cast<size_t>(DTypeSize(set->run().params(late).dtype()));
  EXPECT_GT(full_bytes(*first, early), 0u);
  cache.SetDone(*set);  // unit 0 is done with the set: the frame stays, unit 1 reads it
  cache.BeginUnit(1);
  auto second = cache.Bucket(*set, *f, true);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(cache.decoded(), 1u);
  EXPECT_EQ(*second, *first);
  int64_t late_count = 0;
  for (const pb::Slice& s : (*second)->record().slices()) {
    if (s.param_id() == late) late_count += s.count();
  }
  EXPECT_EQ(full_bytes(*second, late), static_cast<size_t>(late_count) * bytes_of);
  cache.BeginUnit(2);
  ASSERT_TRUE(cache.Bucket(*set, *f, true).ok());
  EXPECT_EQ(cache.decoded(), 2u);
}

// A worker walking its block back to front (ParallelForBlocks' odd blocks): the frame at the cut between units 2
// and 1 is decoded once, at 2, and kept for 1; unit 0, past the last unit in that direction that reads it, finds it
// gone.
TEST(ReaderCache, AFrameAtACutServesTheNextUnitBackwards) {
  auto set = TraceSet::Load(Synth("one", testing::Reference()));
  ASSERT_TRUE(set.ok()) << set.status().message();
  const FrameRef* f = FrameOfTwo(*set);
  ASSERT_NE(f, nullptr);
  std::vector<int> plan(set->run().params_size(), -1);
  plan[f->param_ids[0]] = 1;
  plan[f->param_ids[1]] = 2;
  ReaderCache cache;
  cache.Plan(*set, plan);
  cache.BeginUnit(2);
  auto first = cache.Bucket(*set, *f, false);
  ASSERT_TRUE(first.ok()) << first.status().message();
  cache.SetDone(*set);
  cache.BeginUnit(1);
  auto second = cache.Bucket(*set, *f, false);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(cache.decoded(), 1u);
  EXPECT_EQ(*second, *first);
  cache.SetDone(*set);
  cache.BeginUnit(0);
  ASSERT_TRUE(cache.Bucket(*set, *f, false).ok());
  EXPECT_EQ(cache.decoded(), 2u);
}

// Blocks are contiguous, cover every item, are never empty while items last,
// and weigh at most a share of the total plus one item.
// Issue 42: at 10,000 ranks every rank's copy of the same groups, and every reader's copy of the parameter table,
// held gigabytes. A group listed by many ranks is stored once; a reader the cache opens validates against the set's
// table and keeps neither table nor groups; its records read as before.
TEST(TraceSetGroups, AGroupListedByEveryRankIsStoredOnce) {
  testing::SynthSpec spec;
  spec.dp = 4;
  auto set = TraceSet::Load(Synth("groups_dp4", spec));
  ASSERT_TRUE(set.ok()) << set.status().message();
  const std::vector<int>& sdp0 = set->GroupMembers(0, "sdp");
  EXPECT_EQ(sdp0, (std::vector<int>{0, 1, 2, 3}));
  for (int r = 1; r < 4; ++r) EXPECT_EQ(&set->GroupMembers(r, "sdp"), &sdp0) << r;
  EXPECT_EQ(set->run().groups_size(), 4);  // run() keeps rank 0's RunInfo whole
  ASSERT_TRUE(set->table());
  EXPECT_EQ(set->table()->params_size(), set->run().params_size());

  ReaderCache cache;
  auto reader = cache.Get(*set, 2);
  ASSERT_TRUE(reader.ok()) << reader.status().message();
  EXPECT_EQ((*reader)->run_info().params_size(), 0);
  EXPECT_EQ((*reader)->run_info().groups_size(), 0);
  EXPECT_EQ((*reader)->run_info().rank(), 2);
  const auto frames = SelectFrames(*set, {0, pb::FINAL});
  std::vector<SideValues> got, want;
  ReaderCache none(0);
  ASSERT_TRUE(GatherParams(*set, frames, AllIds(*set), Combine::kReplicas, &cache, &got).ok());
  ASSERT_TRUE(GatherParams(*set, frames, AllIds(*set), Combine::kReplicas, &none, &want).ok());
  ExpectSameValues(got, want);
}

// The evidence passes gather one rank's frames at a time (FramesOfRanks): the same values as the world-sized
// list with only that rank's frames.
TEST(ReaderCache, SomeRanksGatherAsTheWorldSizedList) {
  testing::SynthSpec spec;
  spec.dp = 4;
  auto set = TraceSet::Load(Synth("some_ranks_dp4", spec));
  ASSERT_TRUE(set.ok()) << set.status().message();
  const auto all = SelectFrames(*set, {0, pb::PRE_REDUCE});
  std::vector<std::vector<const FrameRef*>> dense(set->world());
  dense[1] = all[1];
  dense[3] = all[3];
  const FramesOfRanks sparse{{1, all[1]}, {3, all[3]}};
  ReaderCache a(0), b(0);
  std::vector<SideValues> x, y;
  ASSERT_TRUE(GatherParams(*set, dense, AllIds(*set), Combine::kSum, &a, &x).ok());
  ASSERT_TRUE(GatherParams(*set, sparse, AllIds(*set), Combine::kSum, &b, &y).ok());
  ExpectSameValues(x, y);
  EXPECT_EQ(a.decoded(), b.decoded());
  for (const SideValues& v : y) EXPECT_EQ(v.ranks, 2);
}

TEST(ParallelForBlocks, BlocksAreContiguousSharesOfTheWeight) {
  const std::vector<int64_t> weight = {5, 1, 1, 1, 10, 1, 1, 1, 1, 2, 3, 1, 1, 7, 1, 1, 1, 1, 1, 0};
  int64_t total = 0, heaviest = 0;
  for (int64_t w : weight) total += std::max<int64_t>(w, 1), heaviest = std::max(heaviest, w);
  for (int t : {1, 2, 3, 8, 20, 40}) {
    const auto blocks = SplitBlocks(weight, t);
    ASSERT_EQ(blocks.size(), static_cast<size_t>(t));
    size_t next = 0;
    for (int b = 0; b < t; ++b) {
      EXPECT_EQ(blocks[b].first, next) << t << " " << b;
      EXPECT_GE(blocks[b].second, blocks[b].first);
      if (b < static_cast<int>(weight.size())) {
        EXPECT_GT(blocks[b].second, blocks[b].first) << t << " " << b;
      }
      int64_t w = 0;
      for (size_t i = blocks[b].first; i < blocks[b].second; ++i) w += std::max<int64_t>(weight[i], 1);
      EXPECT_LE(w, total / t + heaviest + 1) << t << " " << b;
      next = blocks[b].second;
    }
    EXPECT_EQ(next, weight.size()) << t;
  }
}

// Every item once; one thread takes them in order; with several, each thread
// takes its own block in order, even blocks from the front and odd ones from
// the back. With two, the threads walk towards each other and meet at one cut:
// the first takes 0, 1, ... and the second n-1, n-2, ..., each on into the
// other's block when its own is done.
TEST(ParallelForBlocks, EveryItemOnceEachThreadFromItsBlock) {
  const std::vector<int64_t> weight = {5, 1, 1, 1, 10, 1, 1, 1, 1, 2, 3, 1, 1, 7, 1, 1, 1, 1, 1, 1};
  std::vector<size_t> order;
  ParallelForBlocks(weight, 1, [&](size_t i, int) { order.push_back(i); });
  ASSERT_EQ(order.size(), weight.size());
  for (size_t i = 0; i < weight.size(); ++i) EXPECT_EQ(order[i], i);
  for (int threads : {2, 3, 8}) {
    const auto blocks = SplitBlocks(weight, threads);
    std::vector<std::atomic<int>> seen(weight.size());
    std::mutex mu;
    std::vector<std::vector<size_t>> by_worker(threads);
    ParallelForBlocks(weight, threads, [&](size_t i, int w) {
      ++seen[i];
      std::lock_guard<std::mutex> lock(mu);
      by_worker[w].push_back(i);
    });
    for (size_t i = 0; i < weight.size(); ++i) EXPECT_EQ(seen[i].load(), 1) << threads << " " << i;
    for (int w = 0; w < threads; ++w) {
      // What a worker took of its own block is a prefix of it (odd blocks: a suffix), in order.
      const bool backwards = w % 2 == 1;
      size_t expect = backwards ? blocks[w].second : blocks[w].first;
      for (size_t i : by_worker[w]) {
        if (i >= blocks[w].first && i < blocks[w].second) {
          EXPECT_EQ(i, backwards ? --expect : expect++) << threads << " " << w;
        }
      }
    }
    if (threads == 2) {
      for (size_t k = 0; k < by_worker[0].size(); ++k) EXPECT_EQ(by_worker[0][k], k);
      for (size_t k = 0; k < by_worker[1].size(); ++k) EXPECT_EQ(by_worker[1][k], weight.size() - 1 - k);
    }
  }
  ParallelForBlocks({}, 4, [&](size_t, int) { FAIL() << "no items"; });
}

}  // namespace
}  // namespace gradtrace::diff
