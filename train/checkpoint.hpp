// Checkpoints: everything a run needs to continue bit for bit (on the CPU with the same thread
// count): weights, Adam moments, the step, the engine's RNG state, the tokenizer and the model
// config (the data position is the step: batch i is a pure function of i and the seed).
// Written atomically: a temp file beside the target, fsync, rename; a crash mid-save leaves
// the previous checkpoint intact.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <kiln/models/gpt.hpp>
#include <kiln/train/adamw.hpp>
#include <kiln/train/tokenizer.hpp>

namespace kiln {

// 4: the config attributes of weights version 4; 3: every config attribute required, as weights
// version 3 (2: checksummed datasets and metadata; 1: neither; all still read).
constexpr int64_t kCheckpointFormatVersion = 4;

struct CheckpointState {
  int64_t step = 0;        // steps completed
  uint64_t data_seed = 0;  // the dataset's seed
};

void save_checkpoint(const std::string& path, const models::CausalLM& model, const optim::AdamW& opt,
                     const Tokenizer& tokenizer, const CheckpointState& state);
// The same without a tokenizer (training on pre-tokenized data) when `tokenizer` is null.
void save_checkpoint(const std::string& path, const models::CausalLM& model, const optim::AdamW& opt,
                     const Tokenizer* tokenizer, const CheckpointState& state);
// The same with the optimizer's moments given whole (AdamW::whole_moments, which every rank of a
// sharded optimizer calls before one of them writes: the checkpoint is the same whatever the ranks).
void save_checkpoint(const std::string& path, const models::CausalLM& model, const optim::AdamWMoments& moments,
                     const Tokenizer* tokenizer, const CheckpointState& state);
// Restores weights, moments, the optimizer's step and the engine's RNG state into an existing
// model and optimizer of the same config; checks everything before changing anything. A sharded
// optimizer keeps its rank's chunk of the moments (any number of ranks reads any checkpoint).
CheckpointState load_checkpoint(const std::string& path, models::CausalLM& model, optim::AdamW& opt);
// The model a checkpoint holds, built (initialized, not loaded: load_checkpoint loads it), and a
// GPT checkpoint's config.
std::unique_ptr<models::CausalLM> read_checkpoint_model(const std::string& path);
models::GPTConfig read_checkpoint_config(const std::string& path);
Tokenizer read_checkpoint_tokenizer(const std::string& path);  // an error when it holds none
std::optional<Tokenizer> read_checkpoint_tokenizer_if_any(const std::string& path);

}  // namespace kiln
