#include "optimizer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>

namespace gradtrace::capture {

Optimizer::Optimizer(std::string kind, double lr, std::vector<NamedParam>* params)
    : kind_(std::move(kind)), lr_(lr), params_(params) {}

void Optimizer::Step() {
  c10::NoGradGuard no_grad;
  ++t_;
  if (kind_ == "adam" && m_.empty()) {
    for (auto& p : *params_) {
      m_.push_back(at::zeros_like(p.tensor));
      v_.push_back(at::zeros_like(p.tensor));
    }
  }
  constexpr double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  for (size_t i = 0; i < params_->size(); ++i) {
    at::Tensor& p = (*params_)[i].tensor;
    if (!p.grad().defined()) continue;
    const at::Tensor& g = p.grad();
    if (kind_ == "sgd") {
      p.sub_(g, lr_);
    } else {
      m_[i].mul_(b1).add_(g, 1 - b1);
      v_[i].mul_(b2).addcmul_(g, g, 1 - b2);
      const double c1 = 1 - std::pow(b1, static_cast<double>(t_)), c2 = 1 - std::pow(b2, static_cast<double>(t_));
      at::Tensor denom = (v_[i] / c2).sqrt_().add_(eps);
      p.addcdiv_(m_[i], denom, -lr_ / c1);
    }
  }
}

void Optimizer::ZeroGrad() {
  for (auto& p : *params_) p.tensor.mutable_grad() = at::Tensor();
}

}  // namespace gradtrace::capture
