// AdamW (Loshchilov & Hutter) as PyTorch computes it: bias-corrected moments, decoupled weight
// decay p -= lr * wd * p applied to 2-D parameters only (matrices and embeddings; none on
// biases and LayerNorm, as nanoGPT). Moments live in the state arena; the step count advances,
// and the learning rate and bias corrections are made, each time the step runs (run hooks and
// per-run scalars), so every step replays one plan and a traced step needs no re-recording.
#pragma once

#include <map>
#include <vector>

#include <kiln/circuit/ir/host_tensor.hpp>
#include <kiln/circuit/ir/scalar_exp.hpp>
#include <kiln/core/tensor.hpp>

namespace kiln::optim {

struct AdamWOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  // A step whose gradients' global norm (or the loss given to step()) is not finite changes
  // neither the parameters nor the moments and is not counted: it is skipped, as PyTorch's
  // GradScaler skips optimizer.step(). The test runs inside the step (no host round trip);
  // last_step_applied() tells the host afterwards. Off: every update is applied as computed.
  bool skip_non_finite = false;
  // Data parallel: the gradients are averaged in buckets of at most this many bytes (`--bucket-mb`),
  // each of which starts its all-reduce as soon as the backward has made it (CPU plans). 25 MiB,
  // as PyTorch DDP's buckets.
  size_t bucket_bytes = size_t{25} << 20;
  // ZeRO stage 1 (`--shard-optimizer`), with several ranks: the parameters, flattened side by side
  // (f32) and padded to N equal chunks, are updated chunk by chunk, rank r's chunk by rank r, which
  // alone holds its moments: the gradients are reduce-scattered, the global norm summed from the
  // chunks, and the updated chunks all-gathered into every rank's parameters. Each element is
  // computed as without sharding (the same sums in the same order), up to the norm's rounding.
  bool shard_over_ranks = false;
};

// Adam's moments of every parameter, whole (a checkpoint's; gathered from the ranks when sharded).
struct AdamWMoments {
  std::vector<HostTensor> exp_avg, exp_avg_sq;
};

class AdamW {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions opts);
  // Records the update of every parameter from its gradient, then realizes the step. With
  // max_grad_norm > 0 the gradients are first scaled by min(1, max_norm / (global norm + 1e-6)),
  // computed inside the same step (as torch.nn.utils.clip_grad_norm_). `loss` (a scalar, may be
  // undefined) joins the finiteness test of skip_non_finite. In a data-parallel run (world() of
  // several ranks) the gradients and the loss are first averaged over the ranks; returns the loss
  // that was tested (the average: every rank's step sees the global batch's loss), undefined
  // without one.
  Tensor step(double max_grad_norm = 0.0, const Tensor& loss = Tensor());
  // The global gradient norm of the last step that clipped or tested finiteness (before clipping).
  double last_grad_norm() const { return last_norm_.defined() ? last_norm_.item() : 0.0; }
  // Whether the last step's update was applied: always, unless skip_non_finite found a
  // non-finite norm or loss. A skipped step is taken off the step count here (it waits for the
  // step to finish), so call this after each step before anything reads steps().
  bool last_step_applied();
  // Adam's moments of every parameter, whole, for checkpoints. Sharded, every rank must call
  // whole_moments (it gathers them); set_moments keeps this rank's chunk. set_moments checks
  // shapes and dtypes against the parameters' (an error names the parameter).
  AdamWMoments whole_moments() const;
  void set_moments(const AdamWMoments& moments);
  void check_moments(const AdamWMoments& moments) const;  // set_moments' checks alone
  // This rank's optimizer-state bytes (its moments).
  size_t state_bytes() const;
  bool sharded() const { return shard_ > 0; }
  void set_steps(int64_t t) { t_ = t; }
  void set_lr(double lr) { opts_.lr = lr; }
  int64_t steps() const { return t_; }

 private:
  struct Scalars {
    Tensor step_size, inv_sqrt_bc2, decay, no_decay;
  };
  // A step's norm (of the averaged gradients' sum of squares, where clipping or skip_non_finite
  // needs it) and its finiteness guard.
  void prepare_norm_and_guard(const Tensor& sum_of_squares, const Tensor& loss, double max_grad_norm);
  // `updated` where the guard's scalars are finite, else `old` (updated itself without a guard).
  Tensor guarded(const Tensor& updated, const Tensor& old) const;
  const Scalars& scalars_for(DType dt);
  // Records one update: m, v assigned, p's new value returned (clipped, guarded).
  Tensor update(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, bool decays);
  Tensor step_sharded(std::vector<Tensor> grads, const Tensor& local_loss, double max_grad_norm);
  // Sharded: a parameter's flat elements [begin, end) lie in this rank's chunk at `at`.
  struct Piece {
    size_t param;
    int64_t begin, end, at;
  };

  std::vector<Tensor> params_;
  std::vector<Tensor> m_, v_;  // per parameter, or sharded per piece
  std::vector<Piece> pieces_;
  int64_t total_ = 0, shard_ = 0;     // sharded: the parameters' elements, a chunk's (N chunks)
  std::map<DType, Scalars> scalars_;  // the step's, per dtype (made once per recording)
  double max_grad_norm_ = 0;
  ScalarExp all_finite_;  // the guard's test over in0 .. in(n-1)
  Tensor last_norm_;
  std::vector<Tensor> guard_;  // skip_non_finite: the scalars that must be finite (norm, loss)
  AdamWOptions opts_;
  int64_t t_ = 0;
  bool unsettled_ = false;  // a step ran whose guard_ the host has not read yet
};

}  // namespace kiln::optim
