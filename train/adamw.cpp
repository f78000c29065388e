// AdamW update recorded as pointwise ops over the persistent buffers.
#include <cmath>
#include <limits>
#include <map>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/distributed.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/train/adamw.hpp>

namespace kiln::optim {

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions opts) : params_(std::move(params)), opts_(opts) {
  for (const Tensor& p : params_) {
    if (!p.requires_grad()) throw Error("AdamW: parameter '" + p.name() + "' does not require gradients");
    m_.push_back(Tensor::state(p.name() + ".exp_avg", p.shape(), p.dtype()));
    v_.push_back(Tensor::state(p.name() + ".exp_avg_sq", p.shape(), p.dtype()));
  }
}

Tensor AdamW::step(double max_grad_norm, const Tensor& local_loss) {
  Engine& engine = Engine::current();
  engine.mark_phase(Phase::Update);
  // The step count and the scalars made from it move each time the step runs, replays of a
  // traced step included, so they are made when it runs (host double arithmetic, as torch's
  // non-capturable AdamW), not when it is recorded.
  engine.on_each_run([this] {
    ++t_;
    unsettled_ = true;
  });
  // Data parallel: the gradients and the loss averaged over the ranks first (core/distributed.hpp),
  // so that the norm, the clipping and the finiteness test see the global ones on every rank.
  std::vector<Tensor> grads;
  for (const Tensor& p : params_) grads.push_back(p.grad());
  if (local_loss.defined()) grads.push_back(local_loss);
  grads = average_over_ranks(grads, opts_.bucket_bytes);
  const Tensor loss = local_loss.defined() ? grads.back() : Tensor();
  if (local_loss.defined()) grads.pop_back();
  // Clipping scales each gradient by min(1, max_norm / (norm + 1e-6)), written into the
  // gradient's own expression (a scalar op of its own would be one more launch).
  auto clipped = [&](const Tensor& g) {
    if (max_grad_norm <= 0.0) return g;
    return map(se::in(0) * se::min(se::c(1.0), se::c(max_grad_norm) / (se::in(1) + se::c(1e-6))), {g, last_norm_});
  };
  if (max_grad_norm > 0.0 || opts_.skip_non_finite) {
    Tensor total;
    for (const Tensor& g : grads) {
      Tensor s = sum(g * g);
      total = total.defined() ? total + s : s;
    }
    last_norm_ = sqrt(total);
  }
  // With skip_non_finite each updated buffer keeps its old value unless the norm (and the loss)
  // are finite: a select, never a blend (0 * NaN is NaN), with the test in every update's own
  // body (a flag op of its own would be one more launch). finite(x) = |x| < inf: false for NaN
  // (an ordered comparison) and for +-inf.
  guard_ = {};
  if (opts_.skip_non_finite) {
    guard_.push_back(last_norm_);
    if (loss.defined()) {
      if (loss.numel() != 1) throw Error("AdamW::step: the loss must be a scalar, got " + loss.shape().str());
      guard_.push_back(reshape(loss, Shape{}));
    }
  }
  const int n = static_cast<int>(guard_.size());
  ScalarExp all_finite;  // over in0 .. in(n-1), the guard's scalars
  for (int k = 0; k < n; ++k) {
    ScalarExp f = se::lt(se::abs(se::in(k)), se::c(std::numeric_limits<double>::infinity()));
    all_finite = all_finite ? all_finite * f : f;
  }
  auto guarded = [&](const Tensor& updated, const Tensor& old) {
    if (guard_.empty()) return updated;
    std::vector<Tensor> inputs = guard_;
    inputs.push_back(updated);
    inputs.push_back(old);
    return map(se::select(all_finite, se::in(n), se::in(n + 1)), inputs);
  };
  // Runtime scalars: they change every step without changing the step's structure. Every
  // parameter (of a dtype) reads the same ones and records the same ops, so the multi-tensor
  // merge makes the whole update one launch. Decoupled weight decay multiplies by
  // 1 - lr * wd (as torch), by 1 where it does not apply.
  struct Scalars {
    Tensor step_size, inv_sqrt_bc2, decay, no_decay;
  };
  std::map<DType, Scalars> scalars;
  auto scalars_for = [&](DType dt) -> const Scalars& {
    auto it = scalars.find(dt);
    if (it == scalars.end()) {
      Scalars k{
          Tensor::per_run_scalar([this] { return opts_.lr / (1.0 - std::pow(opts_.beta1, static_cast<double>(t_))); },
                                 dt, "adamw.step_size"),
          Tensor::per_run_scalar(
              [this] { return 1.0 / std::sqrt(1.0 - std::pow(opts_.beta2, static_cast<double>(t_))); }, dt,
              "adamw.inv_sqrt_bc2"),
          Tensor::per_run_scalar([this] { return 1.0 - opts_.lr * opts_.weight_decay; }, dt, "adamw.decay"),
          Tensor::scalar(1.0, dt)};
      it = scalars.emplace(dt, std::move(k)).first;
    }
    return it->second;
  };
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    const Scalars& k = scalars_for(p.dtype());
    Tensor g = clipped(grads[i]);
    // The moments are assigned first and the update reads them back (forward_assigns lets the
    // update see the assigned values, so it need not wait for the writes).
    m_[i].assign(
        guarded(map(se::in(0) * se::c(opts_.beta1) + se::in(1) * se::c(1.0 - opts_.beta1), {m_[i], g}), m_[i]));
    v_[i].assign(guarded(
        map(se::in(0) * se::c(opts_.beta2) + se::in(1) * se::in(1) * se::c(1.0 - opts_.beta2), {v_[i], g}), v_[i]));
    Tensor decayed = p;
    if (opts_.weight_decay != 0.0) decayed = p * (p.rank() >= 2 ? k.decay : k.no_decay);
    // p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps), as torch.optim.AdamW.
    p.assign(guarded(map(se::in(0) - se::in(1) * se::in(2) / (se::sqrt(se::in(3)) * se::in(4) + se::c(opts_.eps)),
                         {decayed, k.step_size, m_[i], v_[i], k.inv_sqrt_bc2}),
                     p));
  }
  // The averaged gradients are let go first: a handle alive at realize() makes its value an
  // output of the step (kept, and on the GPU downloaded, every step).
  grads = {};
  engine.realize();
  return loss;
}

bool AdamW::last_step_applied() {
  bool applied = true;
  for (const Tensor& t : guard_) applied = applied && std::isfinite(t.item());
  if (unsettled_ && !applied) --t_;
  unsettled_ = false;
  return applied;
}

}  // namespace kiln::optim
