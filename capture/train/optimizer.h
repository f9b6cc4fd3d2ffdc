// SGD and Adam over the model's parameters, stepping on the reduced (FINAL)
// gradients, so multi-step traces show how a scaling error propagates: with
// SGD an sp-times gradient is an sp-times step; Adam normalises most of it away.
#pragma once

#include <ATen/Tensor.h>

#include <string>
#include <vector>

#include "model.h"

namespace gradtrace::capture {

class Optimizer {
 public:
  // kind: "sgd" (p -= lr*g) or "adam" (betas 0.9/0.999, eps 1e-8, bias-corrected).
  Optimizer(std::string kind, double lr, std::vector<NamedParam>* params);
  void Step();
  void ZeroGrad();

 private:
  std::string kind_;
  double lr_;
  std::vector<NamedParam>* params_;
  std::vector<at::Tensor> m_, v_;
  int64_t t_ = 0;
};

}  // namespace gradtrace::capture
