#include "model.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "ulysses.h"

namespace gradtrace::capture {

uint64_t SeedFor(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  uint64_t z = seed ^ (h + 0x9e3779b97f4a7c15ull + (seed << 6) + (seed >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

TransformerLM::TransformerLM(const ModelConfig& c, at::Device device) : config_(c), device_(device) {
  const int64_t H = c.hidden, V = c.vocab;
  Add("embed.tok.weight", {V, H}, 0, 0.02);
  Add("embed.pos.weight", {c.max_seq, H}, 0, 0.02);
  for (int l = 0; l < c.layers; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    Add(b + "ln1.weight", {H}, 1, 0.1);
    Add(b + "ln1.bias", {H}, 0, 0.02);
    Add(b + "attn.qkv.weight", {3 * H, H}, 0, 0.02);
    Add(b + "attn.qkv.bias", {3 * H}, 0, 0.02);
    Add(b + "attn.out.weight", {H, H}, 0, 0.02);
    Add(b + "attn.out.bias", {H}, 0, 0.02);
    Add(b + "ln2.weight", {H}, 1, 0.1);
    Add(b + "ln2.bias", {H}, 0, 0.02);
    if (c.moe_experts > 0) {
      Add(b + "moe.gate.weight", {c.moe_experts, H}, 0, 0.5);
      for (int e = 0; e < c.moe_experts; ++e) {
        const std::string x = b + "moe.experts." + std::to_string(e) + ".";
        Add(x + "fc1.weight", {4 * H, H}, 0, 0.02, true);
        Add(x + "fc1.bias", {4 * H}, 0, 0.02, true);
        Add(x + "fc2.weight", {H, 4 * H}, 0, 0.02, true);
        Add(x + "fc2.bias", {H}, 0, 0.02, true);
      }
    } else {
      Add(b + "mlp.fc1.weight", {4 * H, H}, 0, 0.02);
      Add(b + "mlp.fc1.bias", {4 * H}, 0, 0.02);
      Add(b + "mlp.fc2.weight", {H, 4 * H}, 0, 0.02);
      Add(b + "mlp.fc2.bias", {H}, 0, 0.02);
    }
  }
  Add("ln_f.weight", {H}, 1, 0.1);
  Add("ln_f.bias", {H}, 0, 0.02);
  Add("lm_head.weight", {V, H}, 0, 0.02);
}

void TransformerLM::Add(const std::string& name, std::vector<int64_t> shape, double mean, double std, bool expert) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(SeedFor(config_.seed, name));
  at::Tensor t = at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat)) * std + mean;
  t = t.to(config_.dtype).to(device_).detach().set_requires_grad(true);
  params_.push_back({name, t, expert});
}

const at::Tensor& TransformerLM::P(const std::string& name) const {
  for (const auto& p : params_) {
    if (p.name == name) return p.tensor;
  }
  TORCH_CHECK(false, "no parameter named ", name);
}

at::Tensor TransformerLM::Mlp(const std::string& x_prefix, const at::Tensor& x) const {
  at::Tensor h = at::gelu(at::linear(x, P(x_prefix + "fc1.weight"), P(x_prefix + "fc1.bias")));
  return at::linear(h, P(x_prefix + "fc2.weight"), P(x_prefix + "fc2.bias"));
}

// Top-1 gating: each token goes to its argmax expert, scaled by the gate
// probability (so the gate gets a gradient). Routing is per token, so it is
// the same whatever the SP/DP layout.
at::Tensor TransformerLM::Moe(const std::string& prefix, const at::Tensor& x) const {
  const int64_t H = x.size(-1);
  at::Tensor flat = x.reshape({-1, H});
  at::Tensor probs = at::softmax(at::linear(flat, P(prefix + "gate.weight")), -1);
  auto [top_p, top_i] = probs.max(-1);
  at::Tensor out = at::zeros_like(flat);
  for (int e = 0; e < config_.moe_experts; ++e) {
    at::Tensor rows = (top_i == e).nonzero().squeeze(1);
    if (rows.numel() == 0) continue;  // unused expert: no gradient this step
    at::Tensor y = Mlp(prefix + "experts." + std::to_string(e) + ".", flat.index_select(0, rows));
    out = out.index_add(0, rows, y * top_p.index_select(0, rows).unsqueeze(1));
  }
  return out.reshape(x.sizes());
}

at::Tensor TransformerLM::Forward(const at::Tensor& input_ids, const at::Tensor& position_ids,
                                  const NamedGroup& sp) const {
  const int64_t B = input_ids.size(0), Tl = input_ids.size(1);
  const int64_t H = config_.hidden, nh = config_.heads, hd = H / nh;
  at::Tensor x = at::embedding(P("embed.tok.weight"), input_ids) + at::embedding(P("embed.pos.weight"), position_ids);
  for (int l = 0; l < config_.layers; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    at::Tensor h = at::layer_norm(x, {H}, P(b + "ln1.weight"), P(b + "ln1.bias"));
    at::Tensor qkv = at::linear(h, P(b + "attn.qkv.weight"), P(b + "attn.qkv.bias")).view({B, Tl, 3, nh, hd});
    at::Tensor a = UlyssesAttention(qkv.select(2, 0), qkv.select(2, 1), qkv.select(2, 2), sp);
    x = x + at::linear(a.reshape({B, Tl, H}), P(b + "attn.out.weight"), P(b + "attn.out.bias"));
    h = at::layer_norm(x, {H}, P(b + "ln2.weight"), P(b + "ln2.bias"));
    x = x + (config_.moe_experts > 0 ? Moe(b + "moe.", h) : Mlp(b + "mlp.", h));
  }
  x = at::layer_norm(x, {H}, P("ln_f.weight"), P("ln_f.bias"));
  return at::linear(x, P("lm_head.weight"));
}

}  // namespace gradtrace::capture
