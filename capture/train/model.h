// The decoder-only transformer LM that gradtrace-train trains: token and
// learned position embeddings (looked up by position id, so an SP rank's
// chunk sees its global positions), L pre-LN blocks of causal attention and
// an MLP (or a top-1 MoE MLP of E experts), a final LayerNorm and an untied
// LM head. Plain ATen ops on named leaf tensors; no torch::nn.
//
// Weights are a function of (seed, parameter name) only — each parameter is
// drawn from its own generator seeded by Mix(seed, Fnv1a(name)) in fp32 and
// then cast — so every world size, rank layout and dtype starts from the
// same model.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "process_groups.h"

namespace gradtrace::capture {

struct ModelConfig {
  int vocab = 128;
  int hidden = 64;
  int heads = 4;
  int layers = 2;
  int max_seq = 32;
  int moe_experts = 0;
  uint64_t seed = 1234;
  at::ScalarType dtype = at::kFloat;
};

struct NamedParam {
  std::string name;
  at::Tensor tensor;    // leaf, requires_grad
  bool expert = false;  // MoE expert weight: reduced over the expert-data-parallel group
};

// 64-bit mix of a seed and a string (FNV-1a, then splitmix64).
uint64_t SeedFor(uint64_t seed, const std::string& name);

class TransformerLM {
 public:
  TransformerLM(const ModelConfig& config, at::Device device);

  const ModelConfig& config() const { return config_; }
  std::vector<NamedParam>& params() { return params_; }
  const std::vector<NamedParam>& params() const { return params_; }

  // input_ids, position_ids: [B, Tl] int64, this rank's sequence chunk.
  // Attention spans the whole sequence through the SP group (Ulysses).
  // Returns logits [B, Tl, vocab].
  at::Tensor Forward(const at::Tensor& input_ids, const at::Tensor& position_ids, const NamedGroup& sp) const;

 private:
  const at::Tensor& P(const std::string& name) const;
  void Add(const std::string& name, std::vector<int64_t> shape, double mean, double std, bool expert = false);
  at::Tensor Mlp(const std::string& prefix, const at::Tensor& x) const;
  at::Tensor Moe(const std::string& prefix, const at::Tensor& x) const;

  ModelConfig config_;
  at::Device device_;
  std::vector<NamedParam> params_;
};

}  // namespace gradtrace::capture
