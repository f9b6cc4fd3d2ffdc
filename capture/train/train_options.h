// gradtrace-train's command line (DESIGN.md, "Command-line contract"): the
// options struct and its parser. No LibTorch here, so the launcher and the
// argument tests build quickly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "status.h"

namespace gradtrace::capture {

struct TrainOptions {
  // Launch and topology.
  int nproc = 0;  // > 0: start this many local ranks of this binary (launcher mode)
  int dp = 1;
  int sp = 1;
  std::string backend = "gloo";  // gloo | nccl
  double timeout_s = 60;         // collective and rendezvous timeout

  // Reduction.
  int zero_stage = 0;
  std::string scaling = "mean";            // see scaling.h
  int64_t reduce_bucket_size = 500000000;  // elements, DeepSpeed's default
  bool zero_reduce_scatter = true;         // ZeRO "reduce_scatter" config key
  double gradient_predivide_factor = 1.0;
  bool prescale_gradients = false;

  // Loss and training.
  // local-mean | local-mean-div-sp | token-weighted | global-token-weighted | full-sequence
  std::string loss = "local-mean";
  int steps = 1;
  int gas = 1;
  std::string optimizer = "sgd";  // sgd | adam
  double lr = 1e-3;

  // Model.
  uint64_t seed = 1234;
  int seq_len = 32;
  int batch = 4;  // global batch (rows) per micro-step, split over dp
  int layers = 2;
  int hidden = 64;
  int heads = 4;
  int vocab = 128;
  int moe_experts = 0;         // 0: dense MLP
  std::string dtype = "FP32";  // proto/dtype.h name (any spelling it accepts)

  // Data.
  double ignore_frac = 0;
  std::string data_file;  // whitespace-separated token ids; empty: synthetic

  // Capture.
  std::string out;                           // trace directory
  std::string capture = "full";              // full | sketch:K | stats | off (train only: no recorder, no trace)
  std::string capture_steps;                 // "0,2,5"; empty: every step
  std::string capture_params;                // regex on parameter names; empty: all
  std::string on_capture_error = "disable";  // disable (warn once, train on without capture) | abort
  bool overwrite = false;                    // replace finished traces in --out (never a live writer's)
  std::string final_mode = "gather";         // gather: FINAL is the full gradient; partition: owned slices only
  int zstd_level = 1;
  std::string capture_direct_io = "on";   // on | off: RecorderOptions::direct_io
  std::string capture_references = "on";  // on | off: RecorderOptions::values_by_reference
  int writer_threads = 1;                 // recorder threads that encode, compress and write
  int64_t capture_queue_mb = 256;         // full mode: host copies waiting for the writer before training blocks

  // The live guard (guard_sink.h): --capture guard, or MODE+guard beside a trace (then `capture` is MODE).
  bool guard = false;
  std::string guard_on_violation = "warn";  // warn | raise (exit 1 at the violating step)
  int guard_every = 1;                      // after the first 4 steps, every k-th step
  double guard_timeout_s = 60;              // the guard's exchange waits this long for a rank
  std::string guard_reference;              // a trusted run's trace: FINAL compared at each of its steps

  // Export: the initial parameters and every global batch of the run, for an
  // external run (tools/repro/ds5248/run.py --model gradtrace) to load. Without
  // --out, gradtrace-train writes the file and exits without training.
  std::string export_init;
};

// Parses argv (argv[0] is the program). On --help, prints usage to stdout and
// returns InvalidArgument with an empty message: the caller exits 0. Any other
// error is one line, without a trailing newline; the caller exits 2.
Expected<TrainOptions> ParseTrainOptions(int argc, const char* const* argv);

// Cross-field checks that do not need the world: divisibility, ranges, known
// names. Returns the first problem as one line.
Status ValidateTrainOptions(const TrainOptions& options);

// --capture off (or guard alone): train without a recorder (overhead baselines).
bool CaptureOff(const TrainOptions& options);

// argv without "--nproc N" / "--nproc=N": what the launcher passes to ranks.
std::vector<std::string> ArgsWithoutNproc(int argc, const char* const* argv);

// "0,2,5" -> {0,2,5}; "3-5" ranges allowed.
Expected<std::vector<int64_t>> ParseStepList(const std::string& text);

}  // namespace gradtrace::capture
