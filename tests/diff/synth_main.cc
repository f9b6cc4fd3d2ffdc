// gradtrace-synth: writes a synthetic trace set (synth_trace.h) for the
// command-line tests and for trying gradtrace-diff without gradtrace-train.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "synth_big.h"
#include "synth_cluster.h"
#include "synth_trace.h"

int main(int argc, char** argv) {
  gradtrace::testing::SynthSpec spec;
  std::string out;
  std::vector<std::string> scramble, experts;
  int64_t grow = 1;
  std::vector<std::string> factors;
  CLI::App app{"gradtrace-synth: write a synthetic trace set with known gradients", "gradtrace-synth"};
  app.add_option("out", out, "output directory")->required();
  app.add_option("--dp", spec.dp);
  app.add_option("--sp", spec.sp);
  app.add_option("--zero-stage", spec.zero_stage);
  app.add_option("--scaling", spec.scaling);
  app.add_option("--loss", spec.loss);
  app.add_option("--gas", spec.gas);
  app.add_option("--steps", spec.steps);
  app.add_option("--capture", spec.capture);
  app.add_option("--prefix", spec.name_prefix, "prefix every parameter name (e.g. module.)");
  app.add_option("--run-id", spec.run_id);
  app.add_option("--split-seed", spec.split_seed, "changes only how ranks share the gradient (rounding noise)");
  app.add_option("--scramble", scramble, "parameters given unrelated gradients");
  app.add_option("--disagree-rank", spec.disagree_rank, "this rank's FINAL replica differs");
  app.add_option("--cp", spec.cp, "context-parallel degree (splits the sequence like sp)");
  app.add_option("--loss-multiplier", spec.loss_multiplier, "the loss passed to backward x this (Megatron-LM #673)");
  app.add_option("--experts", experts, "EXPERT parameters, reduced over their edp group");
  app.add_option("--ep", spec.ep, "expert-parallel degree (edp groups of world / ep ranks)");
  app.add_flag("--divide-as-expected", spec.divide_as_expected, "divide every bucket as its recorded layout needs");
  app.add_option("--framework", spec.framework, "RunInfo.framework");
  app.add_option("--recorded-scaling", spec.recorded_scaling, "Config.scaling as recorded (default: --scaling)");
  app.add_option("--grow", grow, "multiply every parameter's first dimension by N (traces N times larger)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--init-seed", spec.init_seed, "record initial-weight sketches of weights drawn with this seed");
  app.add_option("--data-seed", spec.data_seed, "record input moments of data drawn with this seed");
  app.add_option("--data-seed-from-step", spec.data_seed_from_step, "steps before this one use data seed 1");
  app.add_option("--recorded-gas", spec.recorded_gas, "Config.gas as recorded (default: --gas)");
  app.add_option("--factor", factors, "NAME=X: multiply that parameter's gradient by X (see --factor-from-step)");
  app.add_option("--factor-from-step", spec.factor_from_step, "--factor applies from this step on");
  app.add_option("--comm-dtype", spec.comm_dtype, "round every POST_REDUCE value through fp16/bf16");
  app.add_option("--comm-hook", spec.comm_hook, "Config.comm_hook");
  app.add_option("--reported-grad-norm", spec.reported_grad_norm, "rank 0 reports this grad norm at every step");
  gradtrace::testing::ClusterSpec cluster;
  bool llama70b = false;
  app.add_flag("--llama70b", llama70b,
               "a simulated Megatron cluster: Llama-70B shapes over --dp x --tp x --pp ranks (synth_cluster.h)");
  app.add_option("--tp", cluster.tp, "--llama70b: tensor-parallel degree");
  app.add_option("--pp", cluster.pp, "--llama70b: pipeline stages");
  app.add_option("--layers", cluster.layers, "--llama70b: transformer layers (80)");
  app.add_option("--microbatches", cluster.microbatches, "--llama70b: pipeline micro-batches (default 2 x pp)");
  app.add_option("--planted-stage", cluster.planted_stage, "--llama70b: this stage's reductions divide wrong");
  app.add_option("--planted-divisor", cluster.planted_divisor, "--llama70b: the planted stage's divisor (dp / 2)");
  app.add_option("--threads", cluster.threads, "--llama70b: writer threads");
  app.add_option("--hidden", cluster.shape.hidden, "--llama70b: hidden size (8192)");
  app.add_option("--intermediate", cluster.shape.intermediate, "--llama70b: MLP size (28672)");
  app.add_option("--kv", cluster.shape.kv, "--llama70b: k/v rows (1024)");
  app.add_option("--vocab", cluster.shape.vocab, "--llama70b: vocabulary (128256)");
  bool no_world_group = false, final_only = false;
  app.add_flag("--final-only", final_only, "--llama70b: FINAL records only");
  app.add_flag("--no-world-group", no_world_group,
               "--llama70b: RunInfo lists no world group (its size grows as world^2)");
  app.add_option("--experts-per-layer", cluster.shape.experts, "--llama70b: MoE, this many experts per layer (0)");
  gradtrace::testing::BigParamSpec big;
  big.numel = 0;
  app.add_option("--big-param", big.numel,
                 "one fp32 parameter of NUMEL elements, FINAL only, written chunk by chunk over --dp replicas "
                 "(synth_big.h)");
  app.add_option("--big-factor", big.factor, "--big-param: every value multiplied by this");
  CLI11_PARSE(app, argc, argv);
  if (big.numel != 0) {
    big.dp = spec.dp;
    if (!spec.run_id.empty()) big.run_id = spec.run_id;
    gradtrace::Status st = gradtrace::testing::WriteBigParamSet(out, big);
    if (!st.ok()) {
      std::fprintf(stderr, "gradtrace-synth: %s\n", st.message().c_str());
      return 2;
    }
    return 0;
  }
  if (llama70b) {
    cluster.dp = spec.dp;
    cluster.steps = spec.steps;
    cluster.capture = spec.capture;
    cluster.run_id = spec.run_id;
    cluster.world_group = !no_world_group;
    cluster.final_only = final_only;
    gradtrace::Status st = gradtrace::testing::WriteClusterSet(out, cluster);
    if (!st.ok()) {
      std::fprintf(stderr, "gradtrace-synth: %s\n", st.message().c_str());
      return 2;
    }
    return 0;
  }
  for (const std::string& f : factors) {
    const size_t eq = f.rfind('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "gradtrace-synth: --factor wants NAME=X, got '%s'\n", f.c_str());
      return 2;
    }
    spec.extra_factor[f.substr(0, eq)] = std::stod(f.substr(eq + 1));
  }
  for (auto& p : spec.params) p.shape[0] *= grow;
  spec.scramble.insert(scramble.begin(), scramble.end());
  spec.experts.insert(experts.begin(), experts.end());
  gradtrace::Status st = gradtrace::testing::WriteSynthSet(out, spec);
  if (!st.ok()) {
    std::fprintf(stderr, "gradtrace-synth: %s\n", st.message().c_str());
    return 2;
  }
  return 0;
}
