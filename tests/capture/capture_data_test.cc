// Data and sharding: the global batch is a function of the seed alone, and
// each rank's shard is exactly the #5248 loop's slice with matching position ids.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "data.h"
#include "dist_harness.h"
#include "model.h"
#include "trainer.h"

namespace gradtrace::capture {
namespace {

using testing::RunRanks;

TEST(Data, ShardIsTheIssueLoopSlice) {
  EXPECT_TRUE(RunRanks(1, 1, [](const Groups&) -> std::string {
    DataConfig c;
    c.batch = 4;
    c.seq_len = 8;
    c.vocab = 50;
    c.ignore_frac = 0.5;
    auto src = DataSource::Create(c);
    Batch g = src->Global(3, 1);
    if (!g.input_ids.equal(src->Global(3, 1).input_ids)) return "global batch not deterministic";
    if (g.input_ids.equal(src->Global(3, 0).input_ids)) return "micro-steps share data";
    for (int rank = 0; rank < 4; ++rank) {
      Topology t{2, 2, rank};  // rows 2 per DP rank, 4 tokens per SP rank
      Batch s = ShardBatch(g, t);
      const int64_t r0 = t.dp_rank() * 2, c0 = t.sp_rank() * 4;
      if (!s.input_ids.equal(g.input_ids.narrow(0, r0, 2).narrow(1, c0, 4))) return "input slice";
      if (!s.labels.equal(g.labels.narrow(0, r0, 2).narrow(1, c0, 4))) return "label slice";
      if (!s.position_ids.equal(at::arange(c0, c0 + 4, at::kLong).expand({2, 4}))) return "position ids";
    }
    // Seeded masking gives shards unequal valid counts (the point of --ignore-frac).
    // Per (row, SP chunk) valid counts: not all equal.
    const at::Tensor counts = (g.labels != kIgnoreIndex).to(at::kLong).view({4, 2, 4}).sum(-1);
    if (counts.eq(counts[0][0]).all().item<bool>()) return "every shard has the same valid count";
    return "";
  }));
}

// Regression: with one row the input and label views were contiguous already,
// shared storage, and masking a label wrote -100 into the next input id.
TEST(Data, MaskingLabelsLeavesInputsAlone) {
  DataConfig c;
  c.batch = 1;
  c.seq_len = 32;
  c.vocab = 64;
  c.ignore_frac = 0.5;
  auto src = DataSource::Create(c);
  Batch g = src->Global(0, 0);
  EXPECT_GT((g.labels == kIgnoreIndex).sum().item<int64_t>(), 0);
  EXPECT_EQ((g.input_ids < 0).sum().item<int64_t>(), 0);
  c.ignore_frac = 0;
  Batch unmasked = DataSource::Create(c)->Global(0, 0);
  EXPECT_TRUE(g.input_ids.equal(unmasked.input_ids));
}

TEST(Data, TokenFile) {
  EXPECT_TRUE(RunRanks(1, 1, [](const Groups&) -> std::string {
    const auto path = std::filesystem::temp_directory_path() / ("gt-data-" + std::to_string(getpid()));
    {
      std::ofstream f(path);
      for (int i = 0; i < 100; ++i) f << (i % 7) << (i % 10 == 9 ? "\n" : " ");
    }
    DataConfig c;
    c.batch = 2;
    c.seq_len = 8;
    c.vocab = 7;
    c.file = path.string();
    auto src = DataSource::Create(c);
    if (!src.ok()) return src.status().message();
    Batch g = src->Global(0, 0);
    for (int64_t t = 0; t < 8; ++t) {
      if (g.input_ids[0][t].item<int64_t>() != t % 7 || g.labels[0][t].item<int64_t>() != (t + 1) % 7)
        return "window 0 is not the file's first tokens";
    }
    c.vocab = 5;  // ids 5 and 6 out of range now
    auto bad = DataSource::Create(c);
    std::filesystem::remove(path);
    if (bad.ok()) return "out-of-range token accepted";
    return bad.status().message().find("not an id in [0, 5)") != std::string::npos ? "" : bad.status().message();
  }));
}

TEST(Model, WeightsDependOnSeedOnly) {
  EXPECT_TRUE(RunRanks(1, 1, [](const Groups&) -> std::string {
    ModelConfig c;
    c.hidden = 16;
    c.heads = 4;
    c.vocab = 32;
    c.max_seq = 8;
    TransformerLM a(c, at::kCPU), b(c, at::kCPU);
    c.dtype = at::kDouble;
    TransformerLM d(c, at::kCPU);
    c.seed = 99;
    TransformerLM e(c, at::kCPU);
    for (size_t i = 0; i < a.params().size(); ++i) {
      if (!a.params()[i].tensor.equal(b.params()[i].tensor)) return "same seed, different weights";
      // fp64 weights are the fp32 draws widened: dtype does not change the model.
      if (!d.params()[i].tensor.to(at::kFloat).equal(a.params()[i].tensor)) return "dtype changed the draw";
      if (a.params()[i].tensor.equal(e.params()[i].tensor.to(at::kFloat)))
        return "seed ignored for " + a.params()[i].name;
    }
    return "";
  }));
}

}  // namespace
}  // namespace gradtrace::capture
