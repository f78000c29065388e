// The gated feed-forward of Llama (SwiGLU): down(act(gate(x)) * up(x)), act = SiLU by default,
// projections without bias (Hugging Face names gate_proj, up_proj, down_proj).
// Shape contract: x (..., dim) -> (..., dim); hidden width `hidden`.
#pragma once

#include <kiln/layers/linear.hpp>

namespace kiln::nn {

class GatedMLP : public Module {
 public:
  enum class Activation { SiLU, GELU };
  GatedMLP(int64_t dim, int64_t hidden, Activation act = Activation::SiLU, bool bias = false, double init_std = 0.02,
           double down_init_std = 0.02);
  Tensor forward(const Tensor& x) const;
  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;
  Activation activation;
};

}  // namespace kiln::nn
