// AdamW update recorded as pointwise ops over the persistent buffers; sharded over the ranks
// (ZeRO-1) where asked.
#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include <kiln/circuit/comm/communicator.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/distributed.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/train/adamw.hpp>

namespace kiln::optim {

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions opts) : params_(std::move(params)), opts_(opts) {
  for (const Tensor& p : params_)
    if (!p.requires_grad()) throw Error("AdamW: parameter '" + p.name() + "' does not require gradients");
  const int ranks = world().size();
  if (!opts_.shard_over_ranks || ranks == 1) {
    for (const Tensor& p : params_) {
      m_.push_back(Tensor::state(p.name() + ".exp_avg", p.shape(), p.dtype()));
      v_.push_back(Tensor::state(p.name() + ".exp_avg_sq", p.shape(), p.dtype()));
    }
    return;
  }
  // Rank r's chunk of the parameters flattened side by side: [r S, (r + 1) S), S = ceil(total / N).
  for (const Tensor& p : params_) {
    if (p.dtype() != DType::f32)
      throw Error(fmt::format("AdamW: sharding the optimizer over the ranks takes f32 parameters; '{}' is {}", p.name(),
                              dtype_name(p.dtype())));
    total_ += p.numel();
  }
  shard_ = std::max<int64_t>(1, (total_ + ranks - 1) / ranks);
  const int64_t lo = world().rank() * shard_, hi = std::min(total_, lo + shard_);
  int64_t offset = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    const int64_t a = std::max(offset, lo), b = std::min(offset + p.numel(), hi);
    if (a < b) {
      pieces_.push_back({i, a - offset, b - offset, a - lo});
      m_.push_back(Tensor::state(p.name() + ".exp_avg", Shape{b - a}, DType::f32));
      v_.push_back(Tensor::state(p.name() + ".exp_avg_sq", Shape{b - a}, DType::f32));
    }
    offset += p.numel();
  }
}

size_t AdamW::state_bytes() const {
  size_t bytes = 0;
  for (const std::vector<Tensor>* moments : {&m_, &v_})
    for (const Tensor& t : *moments) bytes += static_cast<size_t>(t.numel()) * dtype_size(t.dtype());
  return bytes;
}

void AdamW::prepare_norm_and_guard(const Tensor& sum_of_squares, const Tensor& loss, double max_grad_norm) {
  max_grad_norm_ = max_grad_norm;
  if (max_grad_norm > 0.0 || opts_.skip_non_finite) last_norm_ = sqrt(sum_of_squares);
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
  all_finite_ = ScalarExp();  // over in0 .. in(n-1), the guard's scalars
  for (int k = 0; k < static_cast<int>(guard_.size()); ++k) {
    ScalarExp f = se::lt(se::abs(se::in(k)), se::c(std::numeric_limits<double>::infinity()));
    all_finite_ = all_finite_ ? all_finite_ * f : f;
  }
  // Runtime scalars: they change every step without changing the step's structure. Every
  // parameter (of a dtype) reads the same ones and records the same ops, so the multi-tensor
  // merge makes the whole update one launch. Decoupled weight decay multiplies by
  // 1 - lr * wd (as torch), by 1 where it does not apply.
  scalars_.clear();
}

Tensor AdamW::guarded(const Tensor& updated, const Tensor& old) const {
  if (guard_.empty()) return updated;
  const int n = static_cast<int>(guard_.size());
  std::vector<Tensor> inputs = guard_;
  inputs.push_back(updated);
  inputs.push_back(old);
  return map(se::select(all_finite_, se::in(n), se::in(n + 1)), inputs);
}

const AdamW::Scalars& AdamW::scalars_for(DType dt) {
  auto it = scalars_.find(dt);
  if (it == scalars_.end()) {
    Scalars k{
        Tensor::per_run_scalar([this] { return opts_.lr / (1.0 - std::pow(opts_.beta1, static_cast<double>(t_))); }, dt,
                               "adamw.step_size"),
        Tensor::per_run_scalar([this] { return 1.0 / std::sqrt(1.0 - std::pow(opts_.beta2, static_cast<double>(t_))); },
                               dt, "adamw.inv_sqrt_bc2"),
        Tensor::per_run_scalar([this] { return 1.0 - opts_.lr * opts_.weight_decay; }, dt, "adamw.decay"),
        Tensor::scalar(1.0, dt)};
    it = scalars_.emplace(dt, std::move(k)).first;
  }
  return it->second;
}

Tensor AdamW::update(const Tensor& p, const Tensor& grad, const Tensor& m, const Tensor& v, bool decays) {
  const Scalars& k = scalars_for(p.dtype());
  // Clipping scales each gradient by min(1, max_norm / (norm + 1e-6)), written into the
  // gradient's own expression (a scalar op of its own would be one more launch).
  const Tensor g =
      max_grad_norm_ <= 0.0
          ? grad
          : map(se::in(0) * se::min(se::c(1.0), se::c(max_grad_norm_) / (se::in(1) + se::c(1e-6))), {grad, last_norm_});
  // The moments are assigned first and the update reads them back (forward_assigns lets the
  // update see the assigned values, so it need not wait for the writes).
  m.assign(guarded(map(se::in(0) * se::c(opts_.beta1) + se::in(1) * se::c(1.0 - opts_.beta1), {m, g}), m));
  v.assign(guarded(map(se::in(0) * se::c(opts_.beta2) + se::in(1) * se::in(1) * se::c(1.0 - opts_.beta2), {v, g}), v));
  Tensor decayed = p;
  if (opts_.weight_decay != 0.0) decayed = p * (decays ? k.decay : k.no_decay);
  // p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps), as torch.optim.AdamW.
  return guarded(map(se::in(0) - se::in(1) * se::in(2) / (se::sqrt(se::in(3)) * se::in(4) + se::c(opts_.eps)),
                     {decayed, k.step_size, m, v, k.inv_sqrt_bc2}),
                 p);
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
  std::vector<Tensor> grads;
  for (const Tensor& p : params_) grads.push_back(p.grad());
  if (sharded()) return step_sharded(std::move(grads), local_loss, max_grad_norm);
  // Data parallel: the gradients and the loss averaged over the ranks first (core/distributed.hpp),
  // so that the norm, the clipping and the finiteness test see the global ones on every rank.
  if (local_loss.defined()) grads.push_back(local_loss);
  grads = average_over_ranks(grads, opts_.bucket_bytes);
  const Tensor loss = local_loss.defined() ? grads.back() : Tensor();
  if (local_loss.defined()) grads.pop_back();
  {
    Tensor total;  // gone before realize(): a live handle's value is an output of the step, kept
    if (max_grad_norm > 0.0 || opts_.skip_non_finite)
      for (const Tensor& g : grads) {
        Tensor s = sum(g * g);
        total = total.defined() ? total + s : s;
      }
    prepare_norm_and_guard(total, loss, max_grad_norm);
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    p.assign(update(p, grads[i], m_[i], v_[i], p.rank() >= 2));
  }
  // The averaged gradients are let go first: a handle alive at realize() makes its value an
  // output of the step (kept, and on the GPU downloaded, every step).
  grads = {};
  engine.realize();
  return loss;
}

Tensor AdamW::step_sharded(std::vector<Tensor> grads, const Tensor& local_loss, double max_grad_norm) {
  const int ranks = world().size();
  const int64_t padded = ranks * shard_;
  // The gradients flattened side by side and padded to N chunks; this rank's chunk of their mean.
  std::vector<Tensor> flat;
  for (const Tensor& g : grads) flat.push_back(reshape(g, Shape{g.numel()}));
  if (padded > total_) flat.push_back(Tensor::zeros(Shape{padded - total_}));
  grads = {};
  // Handles are let go before realize(): a live one's value is an output of the step, kept.
  Tensor chunk = reduce_scatter_mean(concat(flat, 0));
  flat = {};
  const Tensor loss = local_loss.defined() ? average_over_ranks({local_loss}, opts_.bucket_bytes)[0] : Tensor();
  // The global norm from the chunks' sums of squares (the padding adds zeros).
  {
    Tensor total;
    if (max_grad_norm > 0.0 || opts_.skip_non_finite)
      total = reshape(average_over_ranks({reshape(sum(chunk * chunk), Shape{1})}, opts_.bucket_bytes)[0] *
                          Tensor::scalar(static_cast<double>(ranks)),
                      Shape{});
    prepare_norm_and_guard(total, loss, max_grad_norm);
  }
  // This rank's pieces updated, its chunk put back together and every rank's gathered.
  std::vector<Tensor> updated;
  int64_t filled = 0;
  for (size_t k = 0; k < pieces_.size(); ++k) {
    const Piece& piece = pieces_[k];
    const Tensor& p = params_[piece.param];
    const Tensor old = slice(reshape(p, Shape{p.numel()}), 0, piece.begin, piece.end);
    const Tensor g = slice(chunk, 0, piece.at, piece.at + (piece.end - piece.begin));
    updated.push_back(update(old, g, m_[k], v_[k], p.rank() >= 2));
    filled += piece.end - piece.begin;
  }
  if (filled < shard_) updated.push_back(Tensor::zeros(Shape{shard_ - filled}));
  chunk = Tensor();
  Tensor everyone = all_gather(updated.size() == 1 ? updated[0] : concat(updated, 0));
  updated = {};
  int64_t offset = 0;
  for (const Tensor& p : params_) {
    p.assign(reshape(slice(everyone, 0, offset, offset + p.numel()), p.shape()));
    offset += p.numel();
  }
  everyone = Tensor();
  Engine::current().realize();
  return loss;
}

AdamWMoments AdamW::whole_moments() const {
  AdamWMoments out;
  if (!sharded()) {
    for (size_t i = 0; i < params_.size(); ++i) {
      out.exp_avg.push_back(m_[i].to_host());
      out.exp_avg_sq.push_back(v_[i].to_host());
    }
    return out;
  }
  // This rank's chunk of each moment, padded, gathered from every rank and cut into parameters.
  Communicator& comm = world();
  for (const std::vector<Tensor>* moments : {&m_, &v_}) {
    HostTensor all = HostTensor::zeros(DType::f32, Shape{comm.size() * shard_});
    auto* data = all.data<float>();
    for (size_t k = 0; k < pieces_.size(); ++k) {
      const HostTensor h = (*moments)[k].to_host();
      std::copy(h.data<float>(), h.data<float>() + h.numel(), data + comm.rank() * shard_ + pieces_[k].at);
    }
    comm.all_gather(data, all.numel());
    std::vector<HostTensor>& into = moments == &m_ ? out.exp_avg : out.exp_avg_sq;
    int64_t offset = 0;
    for (const Tensor& p : params_) {
      HostTensor whole = HostTensor::zeros(DType::f32, p.shape());
      std::copy(data + offset, data + offset + p.numel(), whole.data<float>());
      into.push_back(std::move(whole));
      offset += p.numel();
    }
  }
  return out;
}

void AdamW::check_moments(const AdamWMoments& moments) const {
  if (moments.exp_avg.size() != params_.size() || moments.exp_avg_sq.size() != params_.size())
    throw Error(fmt::format("AdamW: moments for {} and {} parameters, the optimizer has {}", moments.exp_avg.size(),
                            moments.exp_avg_sq.size(), params_.size()));
  for (size_t i = 0; i < params_.size(); ++i)
    for (const HostTensor* h : {&moments.exp_avg[i], &moments.exp_avg_sq[i]})
      if (h->shape() != params_[i].shape() || h->dtype() != params_[i].dtype())
        throw Error(fmt::format("AdamW: a moment of '{}' is {}{}, the parameter {}{}", params_[i].name(),
                                dtype_name(h->dtype()), h->shape().str(), dtype_name(params_[i].dtype()),
                                params_[i].shape().str()));
}

void AdamW::set_moments(const AdamWMoments& moments) {
  check_moments(moments);
  Engine& engine = Engine::current();
  if (!sharded()) {
    for (size_t i = 0; i < params_.size(); ++i) {
      engine.write_persistent(*m_[i].impl(), moments.exp_avg[i]);
      engine.write_persistent(*v_[i].impl(), moments.exp_avg_sq[i]);
    }
    return;
  }
  for (size_t k = 0; k < pieces_.size(); ++k) {
    const Piece& piece = pieces_[k];
    for (const bool second : {false, true}) {
      const HostTensor& whole = second ? moments.exp_avg_sq[piece.param] : moments.exp_avg[piece.param];
      HostTensor part = HostTensor::zeros(DType::f32, Shape{piece.end - piece.begin});
      std::copy(whole.data<float>() + piece.begin, whole.data<float>() + piece.end, part.data<float>());
      engine.write_persistent(*(second ? v_ : m_)[k].impl(), part);
    }
  }
}

bool AdamW::last_step_applied() {
  bool applied = true;
  for (const Tensor& t : guard_) applied = applied && std::isfinite(t.item());
  if (unsettled_ && !applied) --t_;
  unsettled_ = false;
  return applied;
}

}  // namespace kiln::optim
