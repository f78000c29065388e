// SGD with momentum (PyTorch's formulation: v = mu v + g; p -= lr v). step() records the
// updates and realizes the step: forward, backward and update run as one Circuit.
#pragma once

#include <vector>

#include <kiln/core/tensor.hpp>

namespace kiln::optim {

class SGD {
 public:
  SGD(std::vector<Tensor> params, double lr, double momentum = 0.0);
  // Records p -= lr * (momentum buffer or gradient) for every parameter, then realizes.
  void step();
  void set_lr(double lr) { lr_ = lr; }
  double lr() const { return lr_; }

 private:
  std::vector<Tensor> params_;
  std::vector<Tensor> velocity_;  // momentum buffers (state arena), empty without momentum
  double lr_, momentum_;
};

}  // namespace kiln::optim
