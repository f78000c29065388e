// The transformer MLP: Linear(C, H), GELU (tanh approximation), Linear(H, C), dropout; H = 4C
// unless given (GPT-2's n_inner).
// Shape contract: x: (..., C) -> (..., C).
#pragma once

#include <kiln/layers/dropout.hpp>
#include <kiln/layers/linear.hpp>

namespace kiln::nn {

class MLP : public Module {
 public:
  MLP(int64_t n_embd, double dropout = 0.0, double proj_init_std = 0.02, int64_t hidden = 0);  // hidden 0: 4 n_embd
  Tensor forward(const Tensor& x) const;
  std::shared_ptr<Linear> c_fc, c_proj;
  std::shared_ptr<Dropout> drop;
};

}  // namespace kiln::nn
