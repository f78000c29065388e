// The gated MLP (SwiGLU).
#include <kiln/layers/gated_mlp.hpp>

namespace kiln::nn {

GatedMLP::GatedMLP(int64_t dim, int64_t hidden, Activation act, bool bias, double init_std, double down_init_std)
    : activation(act) {
  gate_proj = register_module("gate_proj", std::make_shared<Linear>(dim, hidden, bias, init_std));
  up_proj = register_module("up_proj", std::make_shared<Linear>(dim, hidden, bias, init_std));
  down_proj = register_module("down_proj", std::make_shared<Linear>(hidden, dim, bias, down_init_std));
}

Tensor GatedMLP::forward(const Tensor& x) const {
  auto s = scope();
  Tensor g = gate_proj->forward(x);
  g = activation == Activation::SiLU ? silu(g) : gelu(g);
  return down_proj->forward(g * up_proj->forward(x));
}

}  // namespace kiln::nn
