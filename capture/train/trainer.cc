#include "trainer.h"

#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <chrono>
#include <cstdio>
#include <fstream>

#include "data.h"
#include "dtype.h"
#include "loss.h"
#include "optimizer.h"
#include "recorder.h"
#include "reducer.h"

namespace gradtrace::capture {

at::ScalarType TorchDType(const std::string& name) {
  pb::DType dtype = pb::DTYPE_UNSPECIFIED;
  const std::optional<at::ScalarType> type = ParseDType(name, &dtype) ? TorchScalarType(dtype) : std::nullopt;
  // Issue 21: an unknown name was trained as fp32 without a word. ValidateTrainOptions refuses one; here it is a bug.
  TORCH_CHECK(type.has_value(), "unknown parameter dtype '", name, "': expected ", DTypeNamesInWords());
  return *type;
}

ModelConfig ModelConfigFrom(const TrainOptions& o) {
  ModelConfig c;
  c.vocab = o.vocab;
  c.hidden = o.hidden;
  c.heads = o.heads;
  c.layers = o.layers;
  c.max_seq = o.seq_len;
  c.moe_experts = o.moe_experts;
  c.seed = o.seed;
  c.dtype = TorchDType(o.dtype);
  return c;
}

namespace {

DataConfig DataConfigFrom(const TrainOptions& o) {
  DataConfig d;
  d.seed = o.seed;
  d.vocab = o.vocab;
  d.batch = o.batch;
  d.seq_len = o.seq_len;
  d.gas = o.gas;
  d.ignore_frac = o.ignore_frac;
  d.file = o.data_file;
  return d;
}

ReduceConfig ReduceConfigFrom(const TrainOptions& o, const ScalingPolicy& policy) {
  ReduceConfig rc;
  rc.zero_stage = o.zero_stage;
  rc.policy = policy;
  rc.bucket_size = o.reduce_bucket_size;
  rc.predivide_factor = o.gradient_predivide_factor;
  rc.prescale = o.prescale_gradients;
  rc.reduce_scatter = o.zero_reduce_scatter;
  rc.final_partition_only = o.final_mode == "partition";
  return rc;
}

// What one optimizer step adds up over its micro-steps on this rank.
struct StepTotals {
  double loss = 0;
  int64_t tokens = 0;
  pb::StepInfo inputs;  // the optimizer-step StepInfo: input moments over the micro-steps (FORMAT.md 4.1)
};

// Forward and backward of one micro-step on this rank's shard of the batch; its StepInfo goes to `sink` when
// it wants the step.
Status RunMicroStep(const TrainOptions& o, const Groups& groups, GradSink* sink, const DataSource& data, int64_t step,
                    int micro, TransformerLM* model, StepTotals* totals) {
  Batch shard = ShardBatch(data.Global(step, micro), groups.topo);
  const at::Tensor ids_d = shard.input_ids.to(at::kDouble);
  pb::StepInfo& inputs = totals->inputs;
  inputs.set_input_count(inputs.input_count() + ids_d.numel());
  inputs.set_input_sum(inputs.input_sum() + ids_d.sum().item<double>());
  inputs.set_input_sumsq(inputs.input_sumsq() + ids_d.square().sum().item<double>());
  at::Tensor ids = shard.input_ids.to(groups.device), pos = shard.position_ids.to(groups.device);
  at::Tensor labels = shard.labels.to(groups.device);
  at::Tensor logits = model->Forward(ids, pos, groups.sp);
  LossResult loss = ComputeLoss(o.loss, logits, labels, groups.sp, groups.sdp, o.dp, o.gas);
  loss.loss.backward();
  const double value = loss.loss.item<double>();
  totals->loss += value;
  totals->tokens += loss.valid_local;
  if (sink == nullptr || !sink->WantsStep(step)) return Status::Ok();
  pb::StepInfo info;
  info.set_step(step);
  info.set_micro_step(micro);
  info.set_loss(value);
  info.set_valid_tokens(loss.valid_local);
  info.set_lr(o.lr);
  return sink->OnStep(info);
}

void KeepStepResult(const TrainHooks& hooks, const TransformerLM& model, double step_loss, TrainResult* result) {
  result->losses.push_back(step_loss);
  if (!hooks.keep_final_grads) return;
  std::vector<at::Tensor> grads;
  for (const auto& p : model.params()) grads.push_back(p.tensor.grad().detach().cpu().clone());
  result->final_grads.push_back(std::move(grads));
}

std::string ProgressLine(const TrainOptions& o, int64_t step, const StepTotals& totals, size_t buckets,
                         std::chrono::steady_clock::time_point t0) {
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  char line[256];
  std::snprintf(line, sizeof(line), "step %lld/%d  loss(rank 0) %.6f  valid tokens(rank 0) %lld  %zu buckets  %.3f s",
                static_cast<long long>(step + 1), o.steps, totals.loss, static_cast<long long>(totals.tokens), buckets,
                secs);
  return line;
}

}  // namespace

Status RunTraining(const TrainOptions& o, const Groups& groups, GradSink* sink, const TrainHooks& hooks,
                   TrainResult* result, TransformerLM* model) {
  auto data = DataSource::Create(DataConfigFrom(o));
  if (!data.ok()) return data.status();
  auto policy = ResolvePolicy(o.scaling);
  if (!policy.ok()) return policy.status();

  Reducer reducer(&model->params(), &groups, ReduceConfigFrom(o, policy.value()));
  reducer.InstallHooks();
  Optimizer optimizer(o.optimizer, o.lr, &model->params());

  for (int64_t step = 0; step < o.steps; ++step) {
    if (hooks.before_step) hooks.before_step(step);
    const auto t0 = std::chrono::steady_clock::now();
    optimizer.ZeroGrad();
    StepTotals totals;
    for (int micro = 0; micro < o.gas; ++micro) {
      GT_RETURN_IF_ERROR(RunMicroStep(o, groups, sink, *data, step, micro, model, &totals));
    }
    GT_RETURN_IF_ERROR(reducer.Reduce(step, o.gas - 1, sink));
    if (sink != nullptr && sink->WantsStep(step)) {
      totals.inputs.set_step(step);
      totals.inputs.set_micro_step(o.gas - 1);
      totals.inputs.set_optimizer_step(true);
      totals.inputs.set_lr(o.lr);
      GT_RETURN_IF_ERROR(sink->OnStep(totals.inputs));
    }
    if (result != nullptr) KeepStepResult(hooks, *model, totals.loss, result);
    optimizer.Step();
    if (hooks.progress) hooks.progress(ProgressLine(o, step, totals, reducer.buckets().size(), t0));
  }
  if (result != nullptr) result->buckets = reducer.buckets();
  return Status::Ok();
}

std::vector<at::Tensor> ReferenceGradients(const TrainOptions& o, int64_t step) {
  TransformerLM model(ModelConfigFrom(o), at::kCPU);
  auto data = DataSource::Create(DataConfigFrom(o));
  TORCH_CHECK(data.ok(), data.status().message());
  NamedGroup single;
  single.name = "sp";
  single.ranks = {0};
  for (int micro = 0; micro < o.gas; ++micro) {
    Batch b = data->Global(step, micro);
    at::Tensor logits = model.Forward(b.input_ids, b.position_ids, single);
    ReferenceLoss(logits, b.labels, ReferenceDp(o.loss, o.dp), o.gas).backward();
  }
  std::vector<at::Tensor> grads;
  for (const auto& p : model.params()) {
    grads.push_back(p.tensor.grad().defined() ? p.tensor.grad().detach().clone() : at::zeros_like(p.tensor).detach());
  }
  return grads;
}

Status ExportInit(const TrainOptions& o) {
  auto data = DataSource::Create(DataConfigFrom(o));
  if (!data.ok()) return data.status();
  TransformerLM model(ModelConfigFrom(o), at::kCPU);
  c10::Dict<std::string, at::Tensor> out;
  for (const auto& p : model.params()) out.insert("param/" + p.name, p.tensor.detach());
  for (int64_t step = 0; step < o.steps; ++step) {
    for (int micro = 0; micro < o.gas; ++micro) {
      const std::string key = "batch/" + std::to_string(step) + "/" + std::to_string(micro) + "/";
      Batch b = data->Global(step, micro);
      out.insert(key + "input_ids", b.input_ids);
      out.insert(key + "labels", b.labels);
      out.insert(key + "position_ids", b.position_ids);
    }
  }
  const std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(out));
  std::ofstream f(o.export_init, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) return Status::IoError("--export-init " + o.export_init + ": cannot write");
  return Status::Ok();
}

}  // namespace gradtrace::capture
