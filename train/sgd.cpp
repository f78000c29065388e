// SGD with momentum over the engine's persistent tensors.
#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/train/sgd.hpp>

namespace kiln::optim {

SGD::SGD(std::vector<Tensor> params, double lr, double momentum)
    : params_(std::move(params)), lr_(lr), momentum_(momentum) {
  for (const Tensor& p : params_) {
    if (!p.requires_grad()) throw Error("SGD: parameter '" + p.name() + "' does not require gradients");
    if (momentum_ != 0.0) velocity_.push_back(Tensor::state(p.name() + ".momentum", p.shape(), p.dtype()));
  }
}

void SGD::step() {
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    // Made each time the step runs: changing lr keeps the plan, and a traced step sees it.
    Tensor lr = Tensor::per_run_scalar([this] { return lr_; }, p.dtype(), "sgd.lr");
    Tensor g = p.grad();
    if (momentum_ != 0.0) {
      velocity_[i].assign(velocity_[i] * momentum_ + g);
      g = velocity_[i];
    }
    p.assign(p - lr * g);
  }
  Engine::current().realize();
}

}  // namespace kiln::optim
