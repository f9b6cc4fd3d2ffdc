// The training loop of gradtrace-train, independent of how the job was
// launched and where the observations go: per step, `gas` micro-steps of
// forward/backward on this rank's shard, then the bucketed reduction and the
// optimizer step.
#pragma once

#include <ATen/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "grad_sink.h"
#include "model.h"
#include "process_groups.h"
#include "reducer.h"
#include "train_options.h"

namespace gradtrace::capture {

// "FP32" (any spelling proto/dtype.h accepts) -> kFloat, ...; TORCH_CHECK-fails on an unknown name.
at::ScalarType TorchDType(const std::string& name);

ModelConfig ModelConfigFrom(const TrainOptions& options);

struct TrainResult {
  std::vector<double> losses;  // this rank's loss per step (sum over micro-steps, as passed to backward)
  // With keep_final_grads: per step, the FINAL gradient of every parameter (CPU copies).
  std::vector<std::vector<at::Tensor>> final_grads;
  std::vector<Bucket> buckets;
};

struct TrainHooks {
  bool keep_final_grads = false;
  // Rank 0's one-line progress per step (no trailing newline).
  std::function<void(const std::string&)> progress;
  // Called before each step (fault injection in tests).
  std::function<void(int64_t step)> before_step;
};

// Builds the model from options.seed, trains options.steps steps, and sends
// StepInfo and the three phases of every bucket to `sink` (may be null).
// Collective failures throw c10::Error; sink failures are returned.
Status RunTraining(const TrainOptions& options, const Groups& groups, GradSink* sink, const TrainHooks& hooks,
                   TrainResult* result, TransformerLM* model);

// The reference gradient of one step from the initial weights, on one
// process, over the global batch: the gradient of sum over micro-steps of
// ReferenceLoss (see loss.h). Parameter order as model.params().
std::vector<at::Tensor> ReferenceGradients(const TrainOptions& options, int64_t step);

// Writes options.export_init: a torch.save-compatible pickle (torch::pickle_save)
// of one dict of str -> tensor, in this order:
//   "param/<name>"                          initial weights, model order, options.dtype
//   "batch/<step>/<micro>/input_ids"        global batch [batch, seq_len] int64, every
//   "batch/<step>/<micro>/labels"           step < options.steps and micro < options.gas
//   "batch/<step>/<micro>/position_ids"     (labels pre-shifted, -100 where ignored)
// Python: torch.load(FILE, weights_only=True). No collectives: any one rank may call it.
Status ExportInit(const TrainOptions& options);

}  // namespace gradtrace::capture
