// gradtrace-diff's analysis, callable without the command line, in two phases:
// compare (load, align, gather on all cores, measure; shardable with --shard)
// and judge (tolerance, verdicts, replica findings, groups, explanation, overall
// verdict). A Comparison is everything the judge needs and nothing that needs
// the trace files, so the parts of a sharded diff, written as partial reports
// (partial_report.h) and merged (merge.h), are judged exactly like one process.
// Tests and the #5248 matrix call these directly and assert on the Report.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "compare/metrics.h"
#include "compare/shard.h"
#include "gradtrace.pb.h"
#include "load/trace_set.h"
#include "report/report.h"
#include "status.h"

namespace gradtrace::diff {

struct DiffOptions {
  pb::Phase phase = pb::FINAL;       // --phase final|post|pre
  std::optional<int64_t> step;       // --step N (default: first common step)
  std::optional<double> rtol;        // --rtol X
  std::string noise_dir;             // --noise A2: a second reference run
  std::vector<std::string> renames;  // --rename 'REGEX=REPL', in order
  int threads = 0;                   // 0 = all cores
  bool progress = false;             // allow a progress bar (still only on a TTY for large input)
  // Work unit: parameters read together, at most this many elements (or one parameter).
  int64_t unit_elements = int64_t{1} << 20;
  // A parameter larger than this is compared in windows of this many elements (half as many where values are
  // kept in double: sums over ranks, fp64), windowed_compare.h, so memory is bounded by the window and the frames
  // in flight, not by the parameter (0: every parameter whole).
  int64_t window_elements = int64_t{1} << 22;
  // Units in the usual FINAL/POST layout are compared straight from the frames (stream_compare.h); false: every
  // unit is reassembled (the same numbers bit for bit; tests compare the paths).
  bool stream = true;
  Shard shard;  // --shard K/N: compare only this share of the aligned parameters
  // Each side's per-rank x per-bucket view (TraceSide.bucket_view): a full --self pass over each side, so only
  // when the HTML report will draw it (--html; shard 0 of a sharded diff, which carries it to the merge).
  bool bucket_view = false;
  // --baseline (load/term_set.h): per parameter name, how much the term's part's rounding exceeds a run's, the
  // part being a difference of two runs: ||side|| / ||side - baseline||. Multiplies that parameter's rtol.
  std::map<std::string, double> rtol_scale;
};

// One aligned parameter after the compare phase.
struct ComparedParam {
  size_t index = 0;  // position in the alignment: A's table order, then B-only parameters
  std::string name;
  int64_t numel = 0;
  std::vector<int64_t> shape;
  std::string dtype;
  std::string param_kind;  // ParamInfo.kind (B's, else A's): "dense", "expert", ... "" unrecorded
  std::string problem;     // non-empty: not compared (absent on a side, shapes differ)
  Metrics metrics;
  std::string note;
  // Disagreement between replicas of this gradient, per side (0 = A, 1 = B).
  struct Replica {
    double rel = 0;          // relative difference; the judge reports it when above rtol
    int first = -1;          // rank holding the first replica
    int other = -1;          // rank that disagrees with it
    std::string other_path;  // its file (set when rel > 0)
  };
  Replica replica[2];
  std::string tied[2];  // per side: why a tied parameter's copies may disagree (explain.h TiedCopiesWords)
  std::optional<double> noise_rel_error;  // rel_error(A, A2) of this parameter under --noise
};

// The compare phase's result: the whole input of the judge.
struct Comparison {
  TraceSide a, b;
  int64_t step = 0;
  std::string phase;                         // "final", "post", "pre"
  std::vector<std::string> notes;            // from the alignment (which step was picked)
  std::vector<std::string> truncations;      // one message per truncated file of A then B
  std::optional<double> rtol;                // --rtol
  std::string noise_dir;                     // --noise, when it sets the tolerance (empty otherwise)
  std::map<std::string, double> rtol_scale;  // DiffOptions::rtol_scale
  size_t param_count = 0;                    // aligned parameters, all shards together
  Shard shard;
  std::string fingerprint;  // identity of the inputs and options (shard.h)
  // What setup_check.h found: "" (nothing), "different-start" or "different-data"; the
  // sentence; the first step whose inputs differ (-1: none).
  std::string setup_verdict, setup_summary;
  int64_t setup_data_step = -1;
  std::vector<ComparedParam> params;  // this shard's parameters, ascending index
};

// A, B and the optional --noise set, loaded (catalogued) with a progress line.
struct LoadedSets {
  TraceSet a, b;
  std::optional<TraceSet> noise;
};
Expected<LoadedSets> LoadSets(const std::string& a_dir, const std::string& b_dir, const DiffOptions& options);

// Compare phase: B against A for the parameters of options.shard. Errors (bad
// input) carry one line naming the file or directory.
Expected<Comparison> CompareSets(const TraceSet& a, const TraceSet& b, const DiffOptions& options,
                                 const TraceSet* noise = nullptr);
Expected<Comparison> RunCompare(const std::string& a_dir, const std::string& b_dir, const DiffOptions& options);

// Judge phase. `c` must hold every aligned parameter (one process, or merged
// parts); InvalidArgument otherwise.
Expected<Report> JudgeComparison(const Comparison& c);

// A report's side (dir, producer, run id, world, config, framework) of a trace set.
TraceSide SideOf(const TraceSet& s);

// Both phases: compares trace set B against A. Errors (bad input) carry one line naming
// the file or directory; differences are not errors but the Report's verdict.
Expected<Report> RunDiff(const std::string& a_dir, const std::string& b_dir, const DiffOptions& options);

// The same on sets already loaded (noise: a second reference set, or null).
Expected<Report> DiffSets(const TraceSet& a, const TraceSet& b, const DiffOptions& options,
                          const TraceSet* noise = nullptr);

}  // namespace gradtrace::diff
