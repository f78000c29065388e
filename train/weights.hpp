// The kiln weights file (HDF5; docs/FORMAT.md): one float32 dataset per parameter at its dotted
// name with '.' -> '/', PyTorch layouts, the tied lm_head/weight as a hard link to
// transformer/wte/weight, root attributes format = "kiln-weights", format_version and the model
// config. Loading checks everything before it changes the model: a missing dataset, a wrong
// shape or dtype, or another format is an error naming it, never a partly loaded model.
#pragma once

#include <string>

#include "models/gpt.hpp"

namespace kiln {

constexpr int64_t kWeightsFormatVersion = 1;

// Reads and checks the format attributes and the model config.
models::GPTConfig read_weights_config(const std::string& path);
// Loads every parameter of `model` from the file (converted to the model's dtype).
void load_weights(const std::string& path, nn::Module& model);
// Writes the model's parameters and config. `tied` lists (link, target) dataset paths written
// as hard links, e.g. {"lm_head/weight", "transformer/wte/weight"}.
void save_weights(const std::string& path, const models::GPT& model);

// "transformer.h.0.ln_1.weight" -> "transformer/h/0/ln_1/weight".
std::string dataset_path(const std::string& parameter_name);

}  // namespace kiln
