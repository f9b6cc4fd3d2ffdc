// Synthetic trace sets written through the real codec (TraceWriter), with
// gradients known in closed form, so gradtrace-diff's answers can be asserted
// exactly without gradtrace-train.
//
// Model: every configuration sees the same reference gradient g (a function of
// the parameter name, element and step only). Each rank's local gradient is a
// share of it: with a local-mean loss the shares of all world x gas cells sum
// to world * g (each rank's loss is a mean over 1/world of the tokens); with
// local-mean-div-sp / token-weighted / full-sequence they sum to dp * g. The
// reduction adds the group's PRE_REDUCE values in fp32 and divides by the
// divisor semantics::PlanBucketScaling plans for the policy (no arithmetic of
// its own): mean -> group size, ds-4530 -> group size / sp, sum -> 1,
// ds-pre-4957 -> (group size / sp)^2 on buckets holding experts. So FINAL = g
// for mean+local-mean and ds-4530+local-mean-div-sp, and sp * g for
// ds-4530+local-mean (#5248).
//
// Context parallelism (cp) splits the sequence like sp: world = dp x sp x cp.
// Expert parameters sit in buckets of their own, reduced over their edp group
// (world / ep ranks, those of equal rank % ep); every edp group receives the
// tokens of all ranks, so its PRE_REDUCE sums to the dense share: dividing by
// the edp size is the ep x bug, semantics::ExpectedDivisor the right answer.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gradtrace.pb.h"
#include "status.h"

namespace gradtrace::testing {

// splitmix64: the generators' deterministic hash of an index or seed.
uint64_t Mix(uint64_t x);

struct SynthParam {
  std::string name;
  std::vector<int64_t> shape;
};

// 14 parameters of a two-layer transformer-like model (the #5248 example size).
std::vector<SynthParam> DefaultParams();

struct SynthSpec {
  int dp = 1;
  int sp = 1;
  int cp = 1;  // context parallel, another split of the sequence
  int zero_stage = 0;
  std::string scaling = "mean";
  std::string loss = "local-mean";
  int gas = 1;
  int steps = 1;
  std::string run_id;            // default: derived from the configuration
  std::string capture = "full";  // "full", "sketch:K", "stats"
  std::string name_prefix;       // e.g. "module." as DeepSpeed's wrapper adds
  std::vector<SynthParam> params = DefaultParams();
  int64_t bucket_elems = 3000;  // parameters packed into buckets of about this many elements (reduce_bucket_size)
  // ZeRO settings that choose each bucket's path (semantics/reduction_path.h); recorded in extra when false.
  bool zero_reduce_scatter = true;
  bool zero_contiguous_gradients = true;
  bool write_pre_post = true;
  uint64_t split_seed = 7;                     // how the gradient is shared across ranks (changes rounding only)
  std::map<std::string, double> extra_factor;  // FINAL/POST of these parameters multiplied
  std::set<std::string> scramble;              // these parameters get unrelated gradients
  int disagree_rank = -1;                      // this rank's FINAL differs from the other replicas
  // "full" or "reference": FINAL holds each rank's own PRE_REDUCE values (a reduction that never happened; gas 1,
  // stage 0), written again or as a reference to the PRE_REDUCE frames (format 1.6): the ranks' references are
  // then byte for byte the same while their values are not.
  std::string final_from_pre;
  // FINAL written as a reference to the rank's own POST_REDUCE frames where those hold FINAL's values (what the
  // capture does, format 1.6): replicas' references then differ where their targets are (each rank's PRE frames,
  // and so its file's offsets, are its own) while the values they name are the same.
  bool final_by_reference = false;
  bool declare_divisor = true;         // set BucketRecord.divisor on POST_REDUCE
  double loss_multiplier = 1;          // the loss passed to backward x this (Megatron-LM #673: cp)
  std::set<std::string> experts;       // EXPERT parameters (ParamInfo.kind), reduced over "edp"
  int ep = 1;                          // expert-parallel degree: edp groups of world / ep ranks
  bool divide_as_expected = false;     // every bucket divided as semantics::ExpectedDivisor says
  std::string framework;               // RunInfo.framework ("" = not recorded)
  std::string recorded_scaling = "=";  // Config.scaling as recorded ("=": the policy's name)
  // Format 1.4 fields, all off by default (so the default output is what a 1.3 writer wrote):
  uint64_t init_seed = 0;           // != 0: ParamInfo.init_sketch of weights drawn with this seed
  uint64_t data_seed = 0;           // != 0: input moments on an optimizer-step StepInfo per step and rank
  int64_t data_seed_from_step = 0;  // steps before this one use data seed 1 (the data differ from here on)
  int recorded_gas = -1;            // Config.gas as recorded (-1: gas)
  int64_t factor_from_step = 0;     // extra_factor applies from this step on (a bug that starts later)
  std::string comm_dtype;           // "fp16"/"bf16": every POST_REDUCE value rounds through it (Config.comm_dtype)
  std::string comm_hook;            // Config.comm_hook
  bool record_comm_dtype = true;    // false: round through comm_dtype without saying so (a 1.3 producer)
  std::string accum_dtype;          // ParamInfo.accum_dtype of every parameter ("" = not recorded)
  double reported_grad_norm = -1;   // >= 0: rank 0's optimizer-step record reports this grad norm
};

// Writes rank-NNNNN.gtrace files for `spec` into `dir` (created if needed).
Status WriteSynthSet(const std::string& dir, const SynthSpec& spec);

// The reference gradient element (what FINAL of a correct run holds).
double ReferenceGradient(const std::string& name, int64_t index, int64_t step);

// Byte surgery for failure tests.
Status TruncateFile(const std::string& path, uint64_t new_size);
Status FlipByte(const std::string& path, uint64_t offset);

}  // namespace gradtrace::testing
