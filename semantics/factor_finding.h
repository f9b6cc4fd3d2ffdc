// What a scale factor B/A between two trace sets means: the rules that turn a
// measured factor, the two recorded configurations and each side's own
// reduction evidence into a typed Finding (cause, dimension, parameter kind,
// side, predicted factor, the fix, the DeepSpeed change behind it, and which
// sentence it reads as). diff/explain/explain.cc only puts a Finding into words.
//
// In order: when both configurations' predictions (predict.h) give the factor,
// the side whose prediction is off carries it and the prediction names the
// cause; otherwise the factor is matched against the configurations' degrees
// (candidates.h) and each side's reductions decide between a loss multiplier
// (the side reduces as its layout needs) and a reduction divisor.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cause.h"
#include "deepspeed_releases.h"
#include "dimension.h"
#include "gradtrace.pb.h"

namespace gradtrace::semantics {

// What one side's own reductions of a parameter kind show: the divisor to
// believe (the producer's declared one, else the --self measure) against the
// one its layout needs (expected_divisor.h).
struct KindReduction {
  std::string param_kind;  // "dense", "expert", ... "" unrecorded
  int group_size = 0;
  double believed = 0;  // 0: neither declared nor measured
  double expected = 0;  // 0: unknown
};

// One side of a two-set diff, as the rules read it.
struct SideFacts {
  pb::Config config;
  bool deepspeed = false;                 // its DeepSpeed history may be cited (CitesDeepSpeed)
  std::vector<KindReduction> reductions;  // empty without PRE_REDUCE and POST_REDUCE records
  double loss_per_replica = 0;            // recorded loss per data-parallel replica; 0 unrecorded
  int64_t valid_tokens_min = 0, valid_tokens_max = 0;
};

// Which sentence a finding reads as: its cause, refined by what the rule saw
// (grouped by cause below). Up/down (Finding::Up) picks between a sentence's
// two directions.
enum class Reading {
  // Cause::kUnexplained, kNone
  kUnmatched,  // no candidate fits the factor
  kMatches,    // B matches A
  // Cause::kDoubleDivision
  kGasDividedTwice,        // 1/gas^2 (DeepSpeed #7749)
  kMoeBucketDividedTwice,  // ZeRO-1/2 MoE buckets before PR #4957
  // Cause::kLossMultiplier
  kGasLoss,                    // up: the loss is not divided by gas; down: divided by gas twice
  kSplitLossDividedAgain,      // down: the loss divides by the split once more than needed
  kSplitLossForPlainMean,      // the same, where the reduction is the plain mean over its group (DDP, FSDP)
  kLocalMeanReducedByDp,       // #5248: a local-mean loss per shard, a reduction by dp only (DeepSpeed)
  kLocalMeanReducedByDpZero3,  // the same on DeepSpeed ZeRO-3's all-reduce path
  kLocalMeanOverShard,         // the same, in a framework whose history is not cited
  kLossTimesSplit,             // a loss multiplied by the split while the reduction is right
  kLossMultiplied,             // any other dimension (or a bare factor)
  kLossScaledOutsideLayout,    // no layout degree fits, but the recorded losses carry the factor
  // Cause::kPredivide
  kPredivide,  // up: multiplied back though never divided; down: divided and never multiplied back
  // Cause::kReductionDivisor
  kExpertTpCopies,          // experts reduced over tp copies of each expert, divided by dp only
  kAllDividedByEdp,         // every gradient divided by edp instead of dp
  kExpertsAveragedOverEdp,  // experts averaged over edp (DeepSpeed PRs #5259/#6546)
  kReplicateLeftOut,        // HSDP: divided by the shard group only
  kDpDivisor,               // up: not divided by dp; down: divided once more
  kWorldDivisor,            // the same for the world size (a 'sum' reduction)
  kSplitDivisor,            // the same for sp or cp
  kSpDividedTwice,          // local-mean-div-sp reduced with a mean over dp x sp
  kTpDivisor,               // tp ranks' identical gradients summed, or divided by tp
  kOtherDivisor,            // less or more than the layout needs
  // Mismatch groups (not a multiple at all): Cause::kUnexplained, then one reading per cause
  kNotAMultiple,
  kLossyCompression,
  kIncompleteGroup,
  kTokenNormalisation,
  // Cause::kPipelineScheduleScaling
  kPipelineSchedule,  // up: a mean loss per micro-batch, scale_grads=False; down: the loss / n and scale_grads=True
  // Cause::kAmbiguous: the alternatives each read as their own sentence
  kAmbiguous,
};

// What in the traces rules a candidate cause out: the reductions of the side that would carry it.
enum class RuledOut {
  kNo,                     // nothing the traces hold
  kReductionsAsNeeded,     // a reduction divisor: that side's reductions divide as its layout needs
  kReductionsCarryFactor,  // a loss multiple: that side's reductions alone are off by the whole factor
  kPlainMeanConvention,    // a reduction divisor: that side's reductions are the plain mean over their group (the
                           // convention a loss is written for), so the loss is what is off
  kRecipeGivesFactor,      // that side's recorded loss recipe (a local mean per shard) over-counts by the split already
  kOtherParamsMatch,       // a loss multiple: it would scale every gradient, and other parameters match
};

struct Finding {
  Cause cause = Cause::kUnexplained;
  Reading reading = Reading::kUnmatched;
  Dimension dimension = Dimension::kNone;  // a degree (degrees.h), kSpCp, or kNone
  std::string param_kind;                  // the kind judged: "dense", "expert", "tp-shard", "replicated", "mixed"
  std::string side;                        // whose configuration carries it: "A", "B", "" (both, or none)
  std::string expression;                  // the candidate the factor equals (candidates.h), "" when none
  std::optional<double> predicted;         // B/A the two configurations predict (predict.h)
  bool prediction_differs = false;         // there is a prediction and the factor is not it
  double factor = 1;                       // the factor in the direction of the side carrying it (A/B for side "A")
  std::string fix;  // the recipe for a loss that over-counts its split ranks (loss_recipes.h SplitFix)
  std::optional<DeepSpeedChange> change;  // the DeepSpeed change behind it; DeepSpeed sides only
  double divisor_once = 0;                // kMoeBucketDividedTwice: the divisor applied each time
  std::optional<double> loss_ratio;       // a loss multiplier the recorded losses confirm: B's / A's
  // When more than one cause predicts the factor (equal degrees: dp = gas; a loss multiple or a divisor in one
  // dimension), every one of them, as a Finding of its own, in preference order: the finding is the one the
  // traces leave (the others ruled out), or kAmbiguous when several are left, with the rerun that separates them.
  std::vector<Finding> alternatives;
  RuledOut ruled_out = RuledOut::kNo;  // as an alternative: what rules it out
  std::optional<double> rerun_factor;  // as an alternative: the B/A it predicts after the rerun
  Dimension rerun = Dimension::kNone;  // kAmbiguous: the degree of side `rerun_side` to change; kNone: none does
  std::string rerun_side;              // "A" or "B"
  int rerun_value = 0;                 // that degree in the rerun
  bool rerun_with_reductions = false;  // kAmbiguous in one dimension: recording PRE/POST would separate them
  // A reduction divisor although the side's recorded reductions divide as its layout needs: only part of the
  // model carries the factor, so it enters outside them (a second all-reduce, a hook that scales gradients).
  bool outside_recorded = false;
  bool Up() const { return factor > 1; }
};

// The finding for parameters of `param_kind` ("dense", "expert", "mixed", ...)
// whose FINAL gradients are `scale` x A's, factors equal within relative `ctol`. `others_match`: other
// parameters of the comparison match (B/A = 1), so a loss multiple, which scales every gradient, is ruled out.
Finding ExplainFactor(double scale, const std::string& param_kind, const SideFacts& a, const SideFacts& b, double ctol,
                      bool others_match = false);

// The finding for parameters that are not a multiple of A: lossy compression,
// a reduction group that leaves out a split dimension, or unequal valid-token
// counts (a per-micro-batch normalised loss), B's evidence before A's; else
// kUnexplained.
Finding ExplainMismatch(const SideFacts& a, const SideFacts& b);

// The kind a group of parameters of `kinds` is explained as: a group holding
// experts is explained as experts (a MoE bucket divides all it holds), except
// without a modelled policy for B, where experts and dense parameters together
// are one reduction of everything ("mixed").
std::string ExplainedKind(const std::set<std::string>& kinds, const pb::Config& b);

// Whether DeepSpeed's history may be cited for a side: its producer or
// framework is DeepSpeed, or its scaling policy models DeepSpeed arithmetic.
bool CitesDeepSpeed(const std::string& producer, const std::string& framework, const pb::Config& c);

// Whether a communication hook is a lossy compression (PowerSGD's low-rank
// approximation): its reductions approximate the sum, they are not a multiple.
bool LossyCompression(const std::string& comm_hook);

}  // namespace gradtrace::semantics
