// The training loop: AdamW with warmup + cosine LR and global-norm clipping, one progress line
// per logging interval (step/total, loss, lr, ms/step, tok/s, ETA) through spdlog, a live line
// on a terminal, a metrics log of every step (train/metrics_log.hpp), periodic validation loss
// over a fixed set of batches, and checkpoints. Ctrl-C or SIGTERM stops after the
// current step with a checkpoint and an error saying where it is (train/interrupt.hpp).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <kiln/models/gpt.hpp>
#include <kiln/train/adamw.hpp>
#include <kiln/train/dataset.hpp>

namespace kiln {

struct TrainOptions {
  int64_t batch = 16;  // sequences a step (over every rank of a data-parallel run together)
  // Gradient accumulation: each rank's share of the batch runs as this many micro-batches, one
  // after another inside the same step (their gradients added, the activations of one at a time
  // alive), for a batch larger than memory or few ranks allow. It must divide the rank's share.
  int64_t grad_accum = 1;
  size_t bucket_bytes = size_t{25} << 20;  // data parallel: AdamWOptions::bucket_bytes
  bool shard_optimizer = false;            // data parallel: AdamWOptions::shard_over_ranks (ZeRO-1)
  int64_t steps = 1000;
  double lr = 1e-3, min_lr = 1e-4;
  int64_t warmup = 100;
  double weight_decay = 0.1, beta2 = 0.99, grad_clip = 1.0;
  int64_t log_interval = 50;
  int64_t eval_interval = 250;  // 0: only at the end
  // A new run (not a resumed one) measures the validation loss before its first step too,
  // logged as step 0: where fine-tuned weights (kiln train --init-from) start from.
  bool validate_before_training = false;
  int64_t eval_batches = 20;
  std::string checkpoint;  // written every checkpoint_interval steps and at the end
  int64_t checkpoint_interval = 500;
  bool stats = false;   // log the step's kernels, bytes, host time outside its work and peak memory
  int64_t stop_at = 0;  // > 0: stop (and checkpoint) after this step, the schedule still spanning `steps`
  // Record the step once and replay it (core/traced_step.hpp); false records every step anew
  // (the model's C++ code runs each step). The two give the same values to the bit.
  bool traced = true;
  // `--tune on`: the first step's plan has its kernels tuned before it is made, and the choices
  // are fixed from then on (Engine::set_tune_next_plan, core/tuning.hpp).
  bool tune_first_step = false;
  // Called with the step count after each step (and its checkpoint); tests deliver signals here.
  std::function<void(int64_t)> after_step;
  // A step whose loss or gradient norm is not finite is never applied (train/adamw.hpp). By
  // default it stops training with an error naming the step; with skip_non_finite the run goes
  // on and counts it (PyTorch's GradScaler), stopping only after max_skipped_in_a_row in a row.
  bool skip_non_finite = false;
  int64_t max_skipped_in_a_row = 10;
  // The metrics log (JSON lines: every step's loss, lr, gradient norm, ms/step, tokens/s, and
  // each validation loss); empty: none. A resumed run appends to it, a new run replaces it.
  std::string metrics_log;
  // A progress line rewritten in place after every step, when standard output is a terminal.
  bool live_progress = true;
  // Where an interrupted run (SIGINT, SIGTERM) writes its checkpoint when `checkpoint` is empty.
  std::string interrupt_checkpoint = "kiln-interrupted.ckpt.h5";
};

struct TrainResult {
  std::vector<double> losses;  // training loss of each step run
  double val_loss = 0;         // at the end
  int64_t skipped_steps = 0;   // steps not applied: a non-finite loss or gradient norm (skip_non_finite)
};

class Trainer {
 public:
  Trainer(models::CausalLM& model, const TextDataset& data, const Tokenizer& tokenizer, uint64_t data_seed,
          TrainOptions opts);
  // For pre-tokenized data: checkpoints then hold no tokenizer.
  Trainer(models::CausalLM& model, const TextDataset& data, uint64_t data_seed, TrainOptions opts);
  // Runs steps [start_step, opts.steps); resume by loading a checkpoint first (resume()).
  TrainResult run();
  // Loads a checkpoint into the model and optimizer; run() continues from its step.
  void resume(const std::string& checkpoint_path);
  // Mean loss over the fixed validation batches (eval mode, no gradients).
  double val_loss();
  optim::AdamW& optimizer() { return opt_; }
  int64_t step() const { return step_; }

 private:
  models::CausalLM& model_;
  const TextDataset& data_;
  const Tokenizer* tokenizer_;  // null for pre-tokenized data
  uint64_t data_seed_;
  TrainOptions opts_;
  optim::AdamW opt_;
  int64_t step_ = 0;
};

}  // namespace kiln
