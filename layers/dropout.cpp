// Dropout.
#include <string>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/layers/dropout.hpp>

namespace kiln::nn {

Dropout::Dropout(double p) : p(p) {
  if (!(p >= 0.0 && p < 1.0)) throw Error("Dropout: expected a probability p in [0, 1), received " + std::to_string(p));
}

Tensor Dropout::forward(const Tensor& x) const {
  if (!is_training() || p == 0.0) return x;
  auto s = scope();
  return dropout(x, p);
}

}  // namespace kiln::nn
