// A simulated Megatron-style cluster (issue 24 item 3): a Llama-70B-shaped
// model (or a smaller or MoE one of the same form, ModelShape) over dp x tp x pp ranks, written in `sketch:K` or
// `stats` mode through the real codec, with a divisor bug planted in one pipeline stage.
//
// Full values of 70B parameters cannot be materialised here, so nothing is:
//   sketch:K  values are computed only at the parameter's sketch positions
//             (FORMAT.md 5), from the same closed-form reference gradient as
//             synth_trace.h (ReferenceGradient);
//   stats     each slice's moments are closed-form functions of (parameter,
//             slice offset, count), consistent in themselves (sum^2 <= n sum_sq);
//             a rank's share scales them.
// Layout as Megatron-LM lays it out: rank = tp_rank + tp (dp_rank + dp pp_rank);
// q/k/v/gate/up, the vocab-parallel embedding and lm_head are TP_SHARD along
// dim 0 (one slice per rank), o/down along dim 1 (one slice per row: a
// row's contiguous run of the rank's columns; in sketch mode only rows holding
// a sketch position are written); norms are REPLICATED over tp. Layers split
// evenly over the stages; embed on the first, final norm and lm_head on the
// last; every rank's table names the whole model with ParamInfo.stages.
// Each rank's gradient is a random positive share of dp x g (local-mean loss),
// reduced over its "dp" group (same tp and pp rank) in fp32 and divided by dp,
// except on `planted_stage`, whose reductions divide by `planted_divisor`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "status.h"
#include "synth_trace.h"

namespace gradtrace::testing {

// A Llama-shaped model's dimensions; the defaults are Llama-70B's: hidden 8192,
// intermediate 28672, 64 heads / 8 kv heads (k/v 1024 rows), vocab 128256,
// untied embedding and lm_head, RMSNorm weights. `experts` > 0 replaces each
// layer's MLP by that many experts (mlp.experts.E.{gate,up,down}_proj.weight,
// each of the MLP's shapes) and a router (mlp.gate.weight, experts x hidden,
// replicated): an MoE model of many tensors (issue 42: 20,000 at 56 layers x
// 118 experts).
struct ModelShape {
  int64_t hidden = 8192, intermediate = 28672, kv = 1024, vocab = 128256;
  int experts = 0;
};

// The model's parameters over `layers` layers (80 for Llama-70B).
std::vector<SynthParam> LlamaParams(int layers, const ModelShape& shape);
inline std::vector<SynthParam> Llama70BParams(int layers = 80) { return LlamaParams(layers, ModelShape{}); }

struct ClusterSpec {
  int dp = 1, tp = 1, pp = 1;
  int layers = 80;
  int microbatches = 0;  // pp_microbatches (0: 2 x pp)
  int steps = 1;
  std::string capture = "sketch:4096";  // "sketch:K" or "stats"
  int planted_stage = -1;               // this stage's reductions divide by planted_divisor (-1: none)
  double planted_divisor = 0;           // 0: dp / 2
  std::string run_id;                   // default: derived from the layout
  int threads = 1;                      // (stage, tp rank) groups written in parallel
  ModelShape shape;                     // Llama-70B's unless changed
  bool world_group = true;              // every rank's RunInfo lists the world group (world ranks each)
  bool final_only = false;              // FINAL records only (no PRE_REDUCE / POST_REDUCE)
};

// Writes rank-NNNNN.gtrace for all dp x tp x pp ranks of `spec` into `dir`.
// InvalidArgument when the layout does not divide the model (layers % pp,
// a sharded dimension % tp) or the mode is not sketch/stats.
Status WriteClusterSet(const std::string& dir, const ClusterSpec& spec);

}  // namespace gradtrace::testing
