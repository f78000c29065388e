// Trainer: the loop, progress lines, validation and checkpoints.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include <kiln/circuit/comm/communicator.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/distributed.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/core/step_stats.hpp>
#include <kiln/core/traced_step.hpp>
#include <kiln/train/checkpoint.hpp>
#include <kiln/train/interrupt.hpp>
#include <kiln/train/metrics_log.hpp>
#include <kiln/train/progress_line.hpp>
#include <kiln/train/schedule.hpp>
#include <kiln/train/trainer.hpp>

namespace kiln {

namespace {
optim::AdamWOptions adamw_options(const TrainOptions& o) {
  optim::AdamWOptions a;
  a.lr = o.lr;
  a.beta2 = o.beta2;
  a.weight_decay = o.weight_decay;
  a.bucket_bytes = o.bucket_bytes;
  a.shard_over_ranks = o.shard_optimizer;
  a.skip_non_finite = true;  // the update is always guarded; run() decides whether to go on
  return a;
}

// Rank r's rows of a global batch of B rows: [r B / W, (r + 1) B / W) for W ranks (the ranks'
// shards together are the batch one process would draw).
Batch shard(const Batch& global) {
  const Communicator& comm = world();
  if (comm.size() == 1) return global;
  auto rows = [&](const Tensor& t) {
    const HostTensor h = t.to_host();
    const int64_t b = h.shape()[0], per = b / comm.size(), width = h.numel() / b;
    HostTensor part = HostTensor::zeros(h.dtype(), Shape{per, h.shape()[1]});
    std::copy(h.data<int32_t>() + comm.rank() * per * width, h.data<int32_t>() + (comm.rank() + 1) * per * width,
              part.data<int32_t>());
    return Tensor::from_host(part);
  };
  return {rows(global.x), rows(global.y)};
}
}  // namespace

Trainer::Trainer(models::CausalLM& model, const TextDataset& data, const Tokenizer& tokenizer, uint64_t data_seed,
                 TrainOptions opts)
    : model_(model),
      data_(data),
      tokenizer_(&tokenizer),
      data_seed_(data_seed),
      opts_(std::move(opts)),
      opt_(model.parameters(), adamw_options(opts_)) {}

Trainer::Trainer(models::CausalLM& model, const TextDataset& data, uint64_t data_seed, TrainOptions opts)
    : model_(model),
      data_(data),
      tokenizer_(nullptr),
      data_seed_(data_seed),
      opts_(std::move(opts)),
      opt_(model.parameters(), adamw_options(opts_)) {}

void Trainer::resume(const std::string& path) {
  CheckpointState s = load_checkpoint(path, model_, opt_);
  step_ = s.step;
  spdlog::info("resumed from '{}' at step {}", path, step_);
}

double Trainer::val_loss() {
  model_.eval();
  const int64_t block = model_.block_size();
  double total = 0;
  for (int64_t i = 0; i < opts_.eval_batches; ++i) {
    Batch b = data_.val_batch(static_cast<uint64_t>(i), opts_.batch, block);
    total += model_.loss(b.x, b.y).item();
  }
  model_.train();
  return total / static_cast<double>(opts_.eval_batches);
}

TrainResult Trainer::run() {
  TrainResult result;
  const int64_t block = model_.block_size();
  // Data parallel: every rank takes its shard of each global batch, and starts from rank 0's
  // parameters; rank 0 alone writes checkpoints and the metrics log.
  Communicator& comm = world();
  if (opts_.batch % comm.size() != 0)
    throw Error(fmt::format("the batch of {} sequences does not split over {} ranks: give --batch a multiple of {}",
                            opts_.batch, comm.size(), comm.size()));
  const int64_t share = opts_.batch / comm.size(), micro = opts_.grad_accum;
  if (micro < 1 || share % micro != 0)
    throw Error(fmt::format("--grad-accum {} must divide the {} sequences each of {} rank(s) runs a step", micro, share,
                            comm.size()));
  broadcast_from_rank0(model_.parameters());
  const bool writes = comm.rank() == 0;
  if (comm.size() > 1) {
    size_t whole = 0;  // unsharded: two moments of every parameter
    for (const Tensor& p : model_.parameters()) whole += 2 * static_cast<size_t>(p.numel()) * dtype_size(p.dtype());
    spdlog::info("optimizer state: {:.3f} MiB on rank 0{} ({:.3f} MiB whole)",
                 static_cast<double>(opt_.state_bytes()) / (1 << 20),
                 opt_.sharded() ? fmt::format(", sharded over {} ranks", comm.size()) : std::string(", not sharded"),
                 static_cast<double>(whole) / (1 << 20));
  }
  // Each rank its own random streams (dropout masks), rank 0 keeping the run's (the one its
  // checkpoints record, from which every rank derives its own again on resume).
  if (comm.rank() > 0) {
    const uint64_t counter = Engine::current().random_counter();
    manual_seed(Engine::current().seed() ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(comm.rank())));
    Engine::current().set_random_counter(counter);
  }
  // A signal may reach the ranks at different steps: they stop after the same one, where any
  // rank has seen one (one all-reduce of a flag a step).
  auto agreed_interrupt = [&comm] {
    int sig = interrupt_signal();
    if (comm.size() == 1) return sig;
    double seen = sig == SIGINT ? 2.0 : sig != 0 ? 1.0 : 0.0;
    double any = seen;
    comm.all_reduce_sum(&any, 1);
    if (sig == 0 && any > 0) sig = SIGTERM;
    return sig;
  };
  const double tokens_per_step = static_cast<double>(opts_.batch * block);
  auto t0 = std::chrono::steady_clock::now();
  int64_t first = step_;
  // Executor time and whole-step time, summed over the steps run after the first (which records
  // the step and builds its plan, and is reported alone).
  double run_ms = 0, step_ms = 0;
  int64_t timed = 0;
  int64_t skipped_in_a_row = 0;
  auto save = [&](const std::string& path) {
    // A sharded optimizer's moments are gathered by every rank; one writes them.
    if (!writes && !opt_.sharded()) return;
    const optim::AdamWMoments moments = opt_.whole_moments();
    if (writes) save_checkpoint(path, model_, moments, tokenizer_, {step_, data_seed_});
  };
  const InterruptGuard interrupts;
  std::unique_ptr<TracedStep> traced;  // made by the first step when opts_.traced
  const bool on_gpu = Engine::current().device() == Device::CUDA;
  const int64_t end = opts_.stop_at > 0 ? std::min(opts_.stop_at, opts_.steps) : opts_.steps;
  std::unique_ptr<MetricsLog> metrics;
  if (!opts_.metrics_log.empty() && writes)
    metrics = std::make_unique<MetricsLog>(opts_.metrics_log, /*append=*/step_ > 0);
  // The Target is named once the first step has run: under `--tune on` that step's plan fixes
  // the run's kernel choices (Engine::set_tune_next_plan).
  auto name_target = [&] {
    if (metrics)
      metrics->start(first, opts_.steps, static_cast<int64_t>(tokens_per_step), Engine::current().target().str());
    if (opts_.stats) spdlog::info("target: {}", Engine::current().target().str());
  };
  ProgressLine live(opts_.live_progress && writes && ProgressLine::stdout_is_terminal());
  if (opts_.validate_before_training && step_ == 0) {
    const double before = val_loss();
    if (metrics) metrics->validation(0, before);
    spdlog::info("step {:5d}/{}  validation loss {:.4f} nats/token (before training)", 0, opts_.steps, before);
  }
  while (step_ < end) {
    double lr = warmup_cosine_lr(step_, opts_.warmup, opts_.steps, opts_.lr, opts_.min_lr);
    opt_.set_lr(lr);
    Batch b = shard(data_.train_batch(static_cast<uint64_t>(step_), opts_.batch, block));
    auto ts = std::chrono::steady_clock::now();
    const double waited_before = world().seconds_waited();
    Tensor loss;
    if (opts_.tune_first_step && step_ == first) Engine::current().set_tune_next_plan(true);
    if (traced) {
      loss = traced->run({b.x.to_host(), b.y.to_host()})[0];
    } else {
      auto record = [&] {
        // Micro-batches of equal rows: the mean of their mean losses is the batch's mean loss,
        // and each backward adds its share (1 / micro) to the gradients (core/engine: a later
        // backward() in the same step adds).
        std::vector<Tensor> xs = {b.x}, ys = {b.y};
        if (micro > 1) {
          const std::vector<int64_t> rows(static_cast<size_t>(micro), share / micro);
          xs = split(b.x, 0, rows);
          ys = split(b.y, 0, rows);
        }
        Tensor l;
        for (size_t k = 0; k < xs.size(); ++k) {
          Tensor lk = model_.loss(xs[k], ys[k]);
          if (micro > 1) lk = lk * (1.0 / static_cast<double>(micro));
          lk.backward();
          l = l.defined() ? l + lk : lk;
        }
        return std::vector<Tensor>{opt_.step(opts_.grad_clip, l)};  // the global batch's loss
      };
      if (opts_.traced) {
        traced = std::make_unique<TracedStep>(std::vector<Tensor>{b.x, b.y}, record);  // runs this step
        loss = traced->outputs()[0];
      } else {
        loss = record()[0];
      }
    }
    // Time doing the step's work (the Eigen executor; on the GPU, from the first launch to the
    // synchronize after the last) and in the whole step, which adds recording the model's C++
    // code and hashing (untraced, or the first traced step), binding, and on the GPU the copies.
    const double this_run_ms = Engine::current().stats().last_work_ms,
                 this_step_ms = 1000 * std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count(),
                 this_step_waited_ms = 1000 * (world().seconds_waited() - waited_before);
    if (step_ > first) {
      run_ms += this_run_ms;
      step_ms += this_step_ms;
      ++timed;
    }
    result.losses.push_back(loss.item());
    if (!opt_.last_step_applied()) {
      // The step's update was not applied (parameters and moments are as after the previous
      // step), so nothing non-finite can reach a checkpoint.
      const std::string kept =
          opts_.checkpoint.empty() ? "" : "; the last checkpoint in '" + opts_.checkpoint + "' is kept";
      const std::string what = fmt::format("the loss is {} and the gradient norm {} (learning rate {:.3g})",
                                           result.losses.back(), opt_.last_grad_norm(), lr);
      if (!opts_.skip_non_finite)
        throw Error(
            fmt::format("training stopped at step {}: {}; its update was not applied and nothing was saved from it{} "
                        "(--skip-non-finite "
                        "skips such steps instead)",
                        step_ + 1, what, kept));
      ++result.skipped_steps;
      if (++skipped_in_a_row >= opts_.max_skipped_in_a_row)
        throw Error(
            fmt::format("training stopped at step {}: {} steps in a row were skipped, the last because {}; "
                        "the run is not recovering{}",
                        step_ + 1, skipped_in_a_row, what, kept));
      live.clear();
      spdlog::warn("step {} skipped: {} ({} skipped so far)", step_ + 1, what, result.skipped_steps);
    } else {
      skipped_in_a_row = 0;
    }
    if (step_ == first) name_target();
    ++step_;
    bool last = step_ == end;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double per_step = secs / static_cast<double>(step_ - first);
    if (metrics)
      metrics->train_step(step_, result.losses.back(), lr, opt_.last_grad_norm(), this_step_ms,
                          tokens_per_step / (this_step_ms / 1000));
    live.update(fmt::format("step {}/{}  loss {:.4f}  {:.0f} tok/s  ETA {:.0f} s", step_, opts_.steps,
                            result.losses.back(), tokens_per_step / per_step,
                            per_step * static_cast<double>(opts_.steps - step_)));
    if (step_ % opts_.log_interval == 0 || last || step_ == first + 1) {
      live.clear();
      spdlog::info("step {:5d}/{}  loss {:.4f}  lr {:.2e}  {:.1f} ms/step  {:.0f} tok/s  ETA {:.0f} s", step_,
                   opts_.steps, result.losses.back(), lr, 1000 * per_step, tokens_per_step / per_step,
                   per_step * static_cast<double>(opts_.steps - step_));
      if (opts_.stats && Engine::current().last_plan()) {
        const Plan& plan = *Engine::current().last_plan();
        const bool first_step = timed == 0;
        const double outside =
                         first_step ? this_step_ms - this_run_ms : (step_ms - run_ms) / static_cast<double>(timed),
                     share = first_step ? outside / this_step_ms : (step_ms - run_ms) / step_ms;
        std::string copies;  // on the GPU: what the last step copied between host and device
        if (on_gpu && plan.device) {
          const cuda::DeviceRunStats& r = plan.device->last_run();
          copies = fmt::format("; host -> device {:.1f} KiB (copies: {}), device -> host {:.1f} KiB (copies: {}){}",
                               static_cast<double>(r.uploaded_bytes) / 1024, r.uploads,
                               static_cast<double>(r.downloaded_bytes) / 1024, r.downloads,
                               r.graph ? "; kernels launched as one CUDA graph" : "");
        }
        if (world().size() > 1)  // the exposed time itself: kiln bench under mpirun (docs/CLI.md)
          copies +=
              fmt::format("; this step waited {:.2f} ms for collectives ({} ranks, buckets of {:.3g} MiB)",
                          this_step_waited_ms, world().size(), static_cast<double>(opts_.bucket_bytes) / (1 << 20));
        const ProcessCounters& fresh = Engine::current().stats().last_counters;
        spdlog::info(
            "stats: {}; host time outside {} {:.3f} ms/step ({:.1f}% of the step; {}){}; this step: {} minor page "
            "faults, {} tensor allocations ({:.1f} KiB)",
            measure_step(plan).summary(), on_gpu ? "the device's work" : "the executor", outside, 100 * share,
            first_step ? "first step: records and plans"
                       : fmt::format("{} {} steps", timed, opts_.traced ? "replayed" : "re-recorded"),
            copies, fresh.minor_faults, fresh.storage_allocations, static_cast<double>(fresh.storage_bytes) / 1024);
      }
    }
    if ((opts_.eval_interval > 0 && step_ % opts_.eval_interval == 0) || last) {
      live.clear();
      result.val_loss = val_loss();
      if (metrics) metrics->validation(step_, result.val_loss);
      spdlog::info("step {:5d}/{}  validation loss {:.4f} nats/token", step_, opts_.steps, result.val_loss);
    }
    const bool saved = !opts_.checkpoint.empty() &&
                       ((opts_.checkpoint_interval > 0 && step_ % opts_.checkpoint_interval == 0) || last);
    if (saved) save(opts_.checkpoint);
    if (opts_.after_step) opts_.after_step(step_);
    if (const int sig = agreed_interrupt(); sig != 0 && !last) {
      const std::string path = opts_.checkpoint.empty() ? opts_.interrupt_checkpoint : opts_.checkpoint;
      if (!saved) save(path);  // this step's checkpoint may have been written just above
      comm.barrier();          // rank 0's checkpoint is on disk before any rank leaves
      throw Error(
          fmt::format("{} received: training stopped after step {} of {}; checkpoint written to '{}' (continue "
                      "with --resume {}; a second signal stops at once)",
                      sig == SIGINT ? "SIGINT (Ctrl-C)" : "SIGTERM", step_, opts_.steps, path, path));
    }
  }
  return result;
}

}  // namespace kiln
