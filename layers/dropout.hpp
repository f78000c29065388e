// Dropout: in training, zeroes each element with probability p (a Philox mask, reproducible
// from the seed) and scales the rest by 1 / (1 - p); the identity in eval mode or for p = 0.
// Shape contract: x: any -> the same shape.
#pragma once

#include <kiln/layers/module.hpp>

namespace kiln::nn {

class Dropout : public Module {
 public:
  explicit Dropout(double p);  // p in [0, 1)
  Tensor forward(const Tensor& x) const;
  double p;
};

}  // namespace kiln::nn
