// The transformer MLP.
#include <kiln/layers/mlp.hpp>

namespace kiln::nn {

MLP::MLP(int64_t n_embd, double dropout, double proj_init_std, int64_t hidden) {
  if (hidden <= 0) hidden = 4 * n_embd;
  c_fc = register_module("c_fc", std::make_shared<Linear>(n_embd, hidden));
  c_proj = register_module("c_proj", std::make_shared<Linear>(hidden, n_embd, true, proj_init_std));
  drop = register_module("dropout", std::make_shared<Dropout>(dropout));
}

Tensor MLP::forward(const Tensor& x) const {
  auto s = scope();
  return drop->forward(c_proj->forward(gelu(c_fc->forward(x))));
}

}  // namespace kiln::nn
