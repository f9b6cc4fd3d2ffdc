// Training data: one deterministic global batch per (step, micro-step) — the
// same in every configuration — and the shard each rank takes from it.
// Labels are pre-shifted (labels[t] = token[t+1]) so a sequence chunk carries
// exactly the labels of its own positions, as in the #5248 loop.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "status.h"
#include "topology.h"

namespace gradtrace::capture {

inline constexpr int64_t kIgnoreIndex = -100;

struct Batch {
  at::Tensor input_ids;     // [rows, T] int64
  at::Tensor labels;        // [rows, T] int64, kIgnoreIndex where masked
  at::Tensor position_ids;  // [rows, T] int64, global positions
};

struct DataConfig {
  uint64_t seed = 1234;
  int vocab = 128;
  int batch = 4;  // global rows per micro-step
  int seq_len = 32;
  int gas = 1;
  double ignore_frac = 0;  // fraction of labels masked (seeded, so shards get unequal valid counts)
  std::string file;        // whitespace-separated token ids; empty: uniform random tokens
};

class DataSource {
 public:
  // Reads `config.file` when set; every id must be in [0, vocab) and the file
  // must hold more than seq_len + 1 tokens.
  static Expected<DataSource> Create(const DataConfig& config);

  // The global batch [batch, seq_len] of one micro-step.
  Batch Global(int64_t step, int micro_step) const;

 private:
  DataConfig config_;
  std::vector<int64_t> tokens_;
};

// Rows [d*B/dp, (d+1)*B/dp) for DP rank d, columns [s*T/sp, (s+1)*T/sp) with
// their position ids for SP rank s.
Batch ShardBatch(const Batch& global, const Topology& topo);

}  // namespace gradtrace::capture
