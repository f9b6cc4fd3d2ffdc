// The result of one gradtrace-diff run, independent of how it is rendered.
// text.cc, markdown.cc, html.cc and json.cc (this room) render it; diff/REPORT_SCHEMA.md documents its JSON form.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cause.h"
#include "compare/metrics.h"
#include "compare/tolerance.h"
#include "dimension.h"
#include "explain/localise.h"
#include "gradtrace.pb.h"

namespace gradtrace::diff {

// The report JSON's schema_version (REPORT_SCHEMA.md: minor adds fields).
inline constexpr char kReportSchemaVersion[] = "1.9";

// diff(1) convention: 0 no differences, 1 differences found; 3 the runs'
// setup differs (different initial weights or data: not a gradient verdict).
// 2 is bad input or usage, never a verdict.
inline int ExitCodeOf(const std::string& verdict) {
  if (verdict == "match" || verdict == "ok") return 0;
  return verdict == "different-start" || verdict == "different-data" ? 3 : 1;
}

struct ParamResult {
  std::string name;
  int64_t numel = 0;
  std::vector<int64_t> shape;
  std::string dtype;
  std::string param_kind;  // ParamInfo.kind of B (else A): "dense", "expert", "tp-shard", "replicated", "" unrecorded
  Metrics metrics;
  Verdict verdict = Verdict::kMissing;
  double rtol = 0;    // the tolerance this parameter was judged with
  std::string note;   // why missing, shape problem, coverage, replica disagreement
  bool zero = false;  // matched only by the absolute floor: zero up to rounding, no scale to group by
};

// One cause that predicts a group's factor when several do (since schema 1.6; REPORT_SCHEMA.md "groups[]").
struct CandidateCause {
  semantics::Cause cause = semantics::Cause::kUnexplained;
  semantics::Dimension dimension = semantics::Dimension::kNone;
  std::string side;                      // whose configuration would carry it: "A", "B"
  std::string expression;                // the candidate, e.g. "gas(B)"
  std::string explanation;               // its sentence
  std::string ruled_out_by;              // the evidence in the traces that rules it out; "" when nothing does
  std::optional<double> rerun_predicts;  // the B/A it predicts after the group's rerun
};

// Parameters sharing a scale factor (or a problem), and what explains it.
struct Group {
  std::string kind;             // "scale", "mismatch", "missing", "nonfinite"
  std::optional<double> scale;  // kind == "scale" (diff) or the effective divisor (self)
  int count = 0;
  std::string expression;   // the configuration expression the factor equals, e.g. "sp(B)"
  std::string explanation;  // one sentence for a user
  std::vector<std::string> params;
  // The cause in machine-readable form (since schema 1.2; REPORT_SCHEMA.md "groups[]"):
  // semantics::CauseName spells it; none for missing/nonfinite groups ("" in JSON)
  std::optional<semantics::Cause> cause;
  semantics::Dimension dimension = semantics::Dimension::kNone;  // the parallel dimension it follows (DimensionName)
  std::string param_kind;           // the group's parameters: "dense", "expert", "tp-shard", "replicated", "mixed", ""
  std::string side;                 // whose configuration carries the cause: "A", "B", "" (none or both)
  std::optional<double> predicted;  // B/A (diff) or the divisor (self) the recorded layouts predict
  // Every cause that predicts the factor when more than one does (cause "ambiguous" when the traces leave
  // several, else the one left and those they rule out); empty otherwise.
  std::vector<CandidateCause> candidates;
  std::string rerun;  // cause "ambiguous": the rerun that would tell the candidates left apart; "" otherwise
  std::optional<Localisation> localisation;  // kind "mismatch": where it enters, when a parameter after it agrees
};

// A problem that is not one parameter's verdict: truncated file, replicas disagreeing.
struct Finding {
  std::string kind;  // "truncated", "replica", "divisor", "note", ... (report.schema.json lists them)
  std::string message;
};

// What one side's own reductions show, per parameter kind: the --self measure
// (effective divisor of PRE_REDUCE sums against POST_REDUCE) and the divisor
// the producer declared, against what the recorded layout needs.
struct ReductionEvidence {
  std::string param_kind;  // "dense", "expert", ... "" unrecorded
  int group_size = 0;
  double measured = 0;  // effective divisor (0 = not measured)
  double declared = 0;  // BucketRecord.divisor (0 = not declared)
  double expected = 0;  // semantics::ExpectedDivisor
  // The divisor to believe: declared when the producer declared one, else measured.
  double Believed() const { return declared > 0 ? declared : measured; }
};

// --self: one parameter's verdict. Larger is worse (table order).
enum class SelfVerdict { kOk, kMissing, kWrongDivisor, kInconsistent };
const char* SelfVerdictName(SelfVerdict v);  // "ok", "missing", "wrong-divisor", "inconsistent"

// --self: one rank's POST_REDUCE of one bucket in one micro-step against the
// PRE_REDUCE sum over its group (bucket_view.h): a cell of the per-rank x
// per-bucket view.
struct BucketCell {
  int rank = 0;
  int32_t micro = 0;
  int32_t bucket = 0;
  std::string group;
  int group_size = 0;
  int params = 0;                          // parameters this rank's POST_REDUCE holds
  int64_t compared = 0;                    // elements compared
  double pre_norm = 0;                     // ||PRE_REDUCE|| of this rank
  double post_norm = 0;                    // ||POST_REDUCE|| this rank holds
  double divisor = 0;                      // <S,S>/<S,P> over the compared elements (NaN: none)
  double residual = 0;                     // ||P - S/divisor|| / ||P||
  double expected = 0;                     // what the loss recipe needs for the group (0 = unknown)
  bool accumulates = false;                // PRE holds the previous micro-step's reduced gradient (bucket_view.h)
  SelfVerdict verdict = SelfVerdict::kOk;  // of this one reduction: divisor against expected, residual
};

struct TraceSide {
  std::string dir;
  std::string producer;
  std::string framework;  // RunInfo.framework ("deepspeed", "pytorch-ddp", ...; "" before format 1.2)
  std::string run_id;
  int world = 0;
  bool truncated = false;
  pb::Config config;
  std::optional<double> reported_grad_norm;   // what the framework reported for the compared step
  std::vector<ReductionEvidence> reductions;  // empty without PRE_REDUCE and POST_REDUCE (or in a merged diff)
  // StepInfo.valid_tokens of the compared step over its (rank, micro-step) records: unequal counts make a
  // per-micro-batch or per-shard normalised loss differ from the total-token mean (not only by a scale).
  int64_t valid_tokens_min = 0, valid_tokens_max = 0;
  // Sum of StepInfo.loss over the step's ranks and micro-steps, per data-parallel replica (sum / dp); 0 when
  // unrecorded. Its ratio between the sides confirms a loss multiplier (a local mean per shard, a loss x cp).
  double loss_per_replica = 0;
  // Since schema 1.3: the side's per-rank x per-bucket view at the compared step (a full --self pass), in a
  // diff that writes HTML (DiffOptions.bucket_view); empty otherwise, without PRE_REDUCE and POST_REDUCE, and
  // in self mode (whose view is Report.bucket_view).
  std::vector<BucketCell> bucket_view;
};

// The reported grad norm of each side against the norm of its FINAL gradients (grad_norm.h).
struct GradNormCheck {
  std::optional<double> reported_a, reported_b;
  double computed_a = 0, computed_b = 0;  // sqrt(sum over parameters of ||FINAL||^2)
  std::optional<double> off_a, off_b;     // reported / computed, where reported
  std::string verdict;                    // "consistent" or "misreported"
  std::string message;                    // one sentence
};

// --self: effective divisor per parameter.
struct SelfParam {
  std::string name;
  int64_t numel = 0;
  std::string group;  // process group reduced over
  int group_size = 0;
  std::string param_kind;  // ParamInfo.kind: "dense", "expert", "tp-shard", "replicated", "" unrecorded
  double divisor = 0;      // effective: sum(PRE over group) / POST
  double residual = 0;     // ||POST - sum/divisor|| / ||POST||
  double expected = 0;     // what the loss recipe needs (0 = unknown)
  double declared = 0;     // BucketRecord.divisor as the producer stated it (0 = unknown)
  // A reduction over a model-parallel group (semantics::ModelParallelReduction): its members put in
  // partial sums of one gradient (expected 1), or identical copies of it (expected the group size).
  bool model_parallel = false;
  bool identical_inputs = false;
  std::vector<int32_t> buckets;
  int64_t compared = 0;
  SelfVerdict verdict = SelfVerdict::kOk;
  bool accumulates = false;  // its bucket accumulates across micro-steps on some rank (bucket_view.h)
};

// One compared step of a diff that compared every common step (the default
// without --step): a row of the step table.
struct StepRow {
  int64_t step = 0;
  std::string verdict;
  int match = 0, differ = 0;  // parameters
  double worst_residual = 0;  // largest finite residual
  std::string summary;
};

struct Report {
  std::string mode = "diff";  // "diff" or "self"
  TraceSide a, b;             // b unused in self mode
  int64_t step = 0;
  std::string phase = "final";
  Tolerance tolerance;
  std::vector<ParamResult> params;  // worst first
  std::vector<Group> groups;
  std::vector<Finding> findings;
  std::vector<SelfParam> self_params;
  std::optional<GradNormCheck> grad_norm;  // phase final (diff) or --self, when a side reported a norm
  std::vector<BucketCell> bucket_view;     // --self: rank, micro-step, bucket order
  // Since schema 1.4: every step the default diff compared (no --step), ascending, when more than one;
  // this report is the first step that differs, else the first step.
  std::vector<StepRow> steps;
  // --self: parameters whose buckets accumulate across micro-steps, over every
  // reduction (self_params mark only those measured; SelfOptions.sample measures
  // a few). Not in the JSON: the bucket view and the findings say it there.
  int accumulating_params = 0;
  std::string verdict = "match";  // "match", "scaled", "mismatch", "missing", "nonfinite", "incomplete", "ok",
                                  // "different-start", "different-data" (setup_check.h)
  std::string summary;            // one line

  int ExitCode() const { return ExitCodeOf(verdict); }
};

// Renderers. Text may use ANSI colour; the others are files.
// top: the parameter table's first (worst) rows, and the problems after them (report/rows.h; 0: the output's
// default); the rest are counted, not listed. The groups and verdict are always complete, and the JSON lists
// every parameter.
std::string RenderText(const Report& r, bool colour, size_t top = 0);
std::string RenderJson(const Report& r);
std::string RenderMarkdown(const Report& r, size_t top = 0);
std::string RenderHtml(const Report& r, size_t top = 0);

// Shared formatting: "%.4g"-style number, "-" for NaN.
std::string FormatNumber(double v, int digits = 4);
// A parameter's max |b_i - a_i| cell: "-" without a basis, "NaN" when a side holds non-finite elements (the
// largest error is then not a number), else FormatNumber(v, 3).
std::string MaxAbsErrorText(const Metrics& m);
// "%.3f": the factors and divisors the explanations quote.
std::string FormatFixed(double v);
// "world 4 (dp 2 x sp 2), ZeRO-2, scaling ds-4530, loss local-mean, gas 1, fp32".
std::string ConfigSummary(const pb::Config& c);
// Headline: "B is 2.000 x A for all 14 parameters (scaled)" or the self-check equivalent.
std::string Headline(const Report& r);

}  // namespace gradtrace::diff
