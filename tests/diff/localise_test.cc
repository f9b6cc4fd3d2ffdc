// Where a mismatch enters the model (explain/localise.h), on verdicts given in the model's recorded order.
#include "explain/localise.h"

#include <gtest/gtest.h>

#include "report/report.h"  // Verdict

namespace gradtrace::diff {
namespace {

// (name, is a mismatch) from verdicts, as explain.cc hands them over.
std::vector<std::pair<std::string, bool>> Params(const std::vector<std::pair<std::string, Verdict>>& v) {
  std::vector<std::pair<std::string, bool>> out;
  for (const auto& [name, verdict] : v) out.emplace_back(name, verdict == Verdict::kMismatch);
  return out;
}

constexpr Verdict kM = Verdict::kMismatch, kOk = Verdict::kMatch, kS = Verdict::kScaled;

// A Mixtral-like model as transformers registers it: a layer's norms after its MLP, the experts fused. An
// auxiliary loss on the routers changes every parameter that feeds the last router (its layer's attention and
// norms included) and none after: the last layer's experts, the final norm and the head agree.
std::vector<std::pair<std::string, bool>> AuxLossOnTheRouters() {
  std::vector<std::pair<std::string, Verdict>> v = {{"model.embed_tokens.weight", kM}};
  for (int layer : {0, 1}) {
    const std::string l = "model.layers." + std::to_string(layer) + ".";
    const Verdict experts = layer == 0 ? kM : kOk;  // layer 0's experts feed layer 1's router
    v.insert(v.end(), {{l + "self_attn.q_proj.weight", kM},
                       {l + "self_attn.o_proj.weight", kM},
                       {l + "mlp.gate.weight", kM},
                       {l + "mlp.experts.gate_up_proj", experts},
                       {l + "mlp.experts.down_proj", experts},
                       {l + "input_layernorm.weight", kM},
                       {l + "post_attention_layernorm.weight", kM}});
  }
  v.insert(v.end(), {{"model.norm.weight", kOk}, {"lm_head.weight", kOk}});
  return Params(v);
}

TEST(Localise, AnAuxiliaryLossEntersAtTheLastRouterNotAtTheNormRegisteredAfterIt) {
  const auto where = LocateMismatch(AuxLossOnTheRouters());
  ASSERT_TRUE(where.has_value());
  EXPECT_EQ(where->module, "model.layers.1.mlp.gate");
  EXPECT_EQ(where->within, "model.layers.1.mlp");
  EXPECT_EQ(where->param, "model.layers.1.mlp.gate.weight");
  EXPECT_EQ(
      (std::vector<int>{where->differ_module, where->differ_within, where->agree_within, where->differ, where->agree}),
      (std::vector<int>{1, 1, 2, 13, 4}));  // 1 + 7 + 5 of 1 + 7 + 7 + 2
  EXPECT_EQ(LocalisationWords(*where),
            "; it enters at 'model.layers.1.mlp.gate': of the parameters of 'model.layers.1.mlp', the 1 in it "
            "differs and the 2 others agree with A; in all, 13 of the model's 17 parameters differ");
}

TEST(Localise, ADifferingParameterBesideAgreeingOnesIsItsOwnEntry) {
  const auto where = LocateMismatch(Params(
      {{"a.weight", kOk}, {"b.qkv.weight", kM}, {"b.qkv.bias", kM}, {"b.out.weight", kS}, {"c.w", kM}, {"c.v", kOk}}));
  ASSERT_TRUE(where.has_value());
  // 'b' and 'c' are both mixed at depth 1; 'c' holds the later difference in the model's order
  EXPECT_EQ(where->within, "c");
  EXPECT_EQ(where->module, "c.w");
  EXPECT_EQ(LocalisationWords(*where),
            "; it enters at 'c.w': of the parameters of 'c', it differs and the 1 other agrees with A; in all, 3 of "
            "the model's 6 parameters differ");
}

TEST(Localise, MoreDifferencesBesideTheEntryAreCounted) {
  const auto where = LocateMismatch(Params(
      {{"m.gate.weight", kM}, {"m.gate.bias", kM}, {"m.aux.weight", kM}, {"m.experts.w", kOk}, {"head.weight", kOk}}));
  ASSERT_TRUE(where.has_value());
  EXPECT_EQ(where->module, "m.aux");  // the later difference in the model's order
  EXPECT_EQ(LocalisationWords(*where),
            "; it enters at 'm.aux': of the parameters of 'm', the 1 in it differs and the 1 other agrees with A (2 "
            "more differ beside it); in all, 3 of the model's 5 parameters differ");
}

TEST(Localise, NoneWithoutAMismatchOrAModuleHoldingBoth) {
  EXPECT_FALSE(LocateMismatch(Params({{"a.w", kOk}, {"b.w", kS}})).has_value());
  EXPECT_FALSE(LocateMismatch(Params({{"a.w", kM}, {"b.w", kOk}})).has_value());  // only the root holds both
  EXPECT_FALSE(LocateMismatch({}).has_value());
}

}  // namespace
}  // namespace gradtrace::diff
