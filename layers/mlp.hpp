// The transformer MLP: Linear(C, 4C), GELU (tanh approximation), Linear(4C, C), dropout.
// Shape contract: x: (..., C) -> (..., C).
#pragma once

#include <kiln/layers/dropout.hpp>
#include <kiln/layers/linear.hpp>

namespace kiln::nn {

class MLP : public Module {
 public:
  MLP(int64_t n_embd, double dropout = 0.0, double proj_init_std = 0.02);
  Tensor forward(const Tensor& x) const;
  std::shared_ptr<Linear> c_fc, c_proj;
  std::shared_ptr<Dropout> drop;
};

}  // namespace kiln::nn
