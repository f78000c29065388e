// The kiln weights file (HDF5; docs/FORMAT.md): one float32 dataset per parameter at its dotted
// name with '.' -> '/', PyTorch layouts, the tied lm_head/weight as a hard link to
// transformer/wte/weight, root attributes format = "kiln-weights", format_version and the model
// config. Loading checks everything before it changes the model: a missing dataset, a wrong
// shape or dtype, or another format is an error naming it, never a partly loaded model.
#pragma once

#include <optional>
#include <string>

#include "models/gpt.hpp"
#include "train/tokenizer.hpp"

namespace kiln {

// 2: datasets with Fletcher-32 checksums in files with metadata checksums (1: neither; still read).
constexpr int64_t kWeightsFormatVersion = 2;

// Reads and checks the format attributes and the model config.
models::GPTConfig read_weights_config(const std::string& path);
// Loads every parameter of `model` from the file (converted to the model's dtype).
void load_weights(const std::string& path, nn::Module& model);
// Writes the model's parameters, config and (when given) tokenizer: attribute tokenizer =
// "char" | "byte", and for "char" an int32 dataset tokenizer/vocab of code points in id order.
// lm_head/weight is a hard link to transformer/wte/weight.
void save_weights(const std::string& path, const models::GPT& model, const Tokenizer* tokenizer = nullptr);
// The tokenizer stored with the weights, or nullopt for a file without one.
std::optional<Tokenizer> load_tokenizer(const std::string& path);

// The pieces weights files and checkpoints share: the model config as root attributes, and the
// tokenizer (attribute + tokenizer/vocab). read_tokenizer returns nullopt when none is stored.
namespace h5 {
class File;
}
void write_model_config(h5::File& f, const models::GPTConfig& c);
models::GPTConfig read_model_config(const h5::File& f);  // sizes checked to lie in [1, 2^31)
// Throws naming the file, the dataset and the element when a float value is NaN or infinite.
void require_finite(const HostTensor& t, const std::string& file, const std::string& dataset);
// Both check that the tokenizer has exactly the model's vocab_size ids (read_tokenizer takes it
// from the file's config attributes).
void write_tokenizer(h5::File& f, const Tokenizer& tokenizer, int64_t vocab_size);
std::optional<Tokenizer> read_tokenizer(const h5::File& f);

// "transformer.h.0.ln_1.weight" -> "transformer/h/0/ln_1/weight".
std::string dataset_path(const std::string& parameter_name);

}  // namespace kiln
