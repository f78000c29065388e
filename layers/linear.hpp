// Linear: y = x W^T + b. Shape contract: x: (..., in) -> y: (..., out); weight: (out, in) as
// PyTorch stores it, bias: (out). Initialized N(0, init_std^2), bias zero.
#pragma once

#include <kiln/layers/module.hpp>

namespace kiln::nn {

class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, bool bias = true, double init_std = 0.02);
  Tensor forward(const Tensor& x) const;
  Tensor weight, bias;  // bias undefined when constructed without one
  int64_t in_features, out_features;
};

}  // namespace kiln::nn
