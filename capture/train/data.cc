#include "data.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <fstream>

#include "model.h"

namespace gradtrace::capture {

Expected<DataSource> DataSource::Create(const DataConfig& config) {
  DataSource d;
  d.config_ = config;
  if (config.file.empty()) return d;
  std::ifstream in(config.file);
  if (!in) return Status::IoError("--data " + config.file + ": cannot open");
  std::string word;
  while (in >> word) {
    char* end = nullptr;
    long long id = std::strtoll(word.c_str(), &end, 10);
    if (*end != '\0' || id < 0 || id >= config.vocab) {
      return Status::InvalidArgument("--data " + config.file + ": token '" + word + "' at index " +
                                     std::to_string(d.tokens_.size()) + " is not an id in [0, " +
                                     std::to_string(config.vocab) + ")");
    }
    d.tokens_.push_back(id);
  }
  if (static_cast<int64_t>(d.tokens_.size()) <= config.seq_len + 1) {
    return Status::InvalidArgument("--data " + config.file + ": " + std::to_string(d.tokens_.size()) +
                                   " tokens, need more than seq_len + 1 = " + std::to_string(config.seq_len + 1));
  }
  return d;
}

Batch DataSource::Global(int64_t step, int micro_step) const {
  const int64_t B = config_.batch, T = config_.seq_len;
  const std::string key = "data/" + std::to_string(step) + "/" + std::to_string(micro_step);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(SeedFor(config_.seed, key));
  at::Tensor tokens;
  if (tokens_.empty()) {
    tokens = at::randint(config_.vocab, {B, T + 1}, gen, at::TensorOptions().dtype(at::kLong));
  } else {
    // Consecutive windows of T+1 tokens, wrapping around the file.
    tokens = at::empty({B, T + 1}, at::kLong);
    auto acc = tokens.accessor<int64_t, 2>();
    const int64_t n = static_cast<int64_t>(tokens_.size());
    for (int64_t b = 0; b < B; ++b) {
      const int64_t row = (step * config_.gas + micro_step) * B + b;
      const int64_t start = (row * T) % (n - T);
      for (int64_t t = 0; t <= T; ++t) acc[b][t] = tokens_[start + t];
    }
  }
  Batch batch;
  // clone, not contiguous(): with one row the narrowed views are already
  // contiguous and would share storage, so masking labels would mask inputs.
  batch.input_ids = tokens.narrow(1, 0, T).clone();
  batch.labels = tokens.narrow(1, 1, T).clone();
  if (config_.ignore_frac > 0) {
    at::Tensor masked = at::rand({B, T}, gen, at::TensorOptions().dtype(at::kDouble)) < config_.ignore_frac;
    batch.labels.masked_fill_(masked, kIgnoreIndex);
  }
  batch.position_ids = at::arange(T, at::kLong).unsqueeze(0).expand({B, T}).contiguous();
  return batch;
}

Batch ShardBatch(const Batch& g, const Topology& topo) {
  const int64_t rows = g.input_ids.size(0) / topo.dp, cols = g.input_ids.size(1) / topo.sp;
  auto cut = [&](const at::Tensor& t) {
    return t.narrow(0, topo.dp_rank() * rows, rows).narrow(1, topo.sp_rank() * cols, cols).contiguous();
  };
  return {cut(g.input_ids), cut(g.labels), cut(g.position_ids)};
}

}  // namespace gradtrace::capture
