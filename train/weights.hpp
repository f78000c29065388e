// The kiln weights file (HDF5; docs/FORMAT.md): one float32 dataset per parameter at its dotted
// name with '.' -> '/', PyTorch layouts, tied parameters' other names as hard links (a GPT's
// lm_head/weight to transformer/wte/weight), root attributes format = "kiln-weights",
// format_version, architecture ("gpt", "llama"; a file of version 1 or 2 without one is a GPT)
// and the model's config attributes. Loading checks everything before it changes the model: a
// wrong shape or dtype, another format, and (strictly) a missing or unexpected dataset are
// errors naming them, never a partly loaded model; a non-strict load loads what matches.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <kiln/models/gpt.hpp>
#include <kiln/train/tokenizer.hpp>

namespace kiln {

// 4: GPT's ffn_hidden and norm_eps, Llama's attention_bias, mlp_bias and rope scaling attributes
// (a version-3 file lacks them: 4 n_embd, 1e-5, no biases, no scaling; an older kiln refuses a
// version-4 file rather than ignore them).
// 3: every config attribute and the architecture required (2: datasets with Fletcher-32
// checksums in files with metadata checksums, and 1, neither: all still read, missing config
// attributes taking their defaults as they always did).
constexpr int64_t kWeightsFormatVersion = 4;
// The first weights and checkpoint format in which no config attribute may be missing.
constexpr int64_t kFormatWithWholeConfig = 3;

// A model as a file describes it: its architecture and checked config attributes.
struct ModelSpec {
  std::string architecture;
  models::ModelAttributes attributes;
};
// Reads and checks the format attributes, the architecture and its config.
ModelSpec read_model_spec(const std::string& path);
// A GPT file's config (an error naming the architecture for any other model).
models::GPTConfig read_weights_config(const std::string& path);
// How load_weights treats a file whose datasets do not match the module's parameters one for one.
struct LoadOptions {
  // Strict (the default, as PyTorch's load_state_dict(strict=True)): a parameter without a
  // dataset, or a dataset no parameter reads (outside tokenizer/), is an error naming each one.
  // Non-strict: the parameters the file holds are loaded, the others keep their values.
  bool strict = true;
};
// What a load found that did not match: filled either way (a strict load that finds anything
// throws, naming the same lists).
struct LoadReport {
  std::vector<std::string> missing;     // parameter names without a dataset in the file
  std::vector<std::string> unexpected;  // dataset paths that no parameter reads
  bool empty() const { return missing.empty() && unexpected.empty(); }
  std::string str() const;  // "missing: a, b; unexpected: c" (or "none")
};
// Loads the parameters of `model` from the file by name (converted to the model's dtype); any
// Module, registered model or not. Shapes and dtypes must match, strict or not; everything is
// checked before the model changes.
LoadReport load_weights(const std::string& path, nn::Module& model, const LoadOptions& options = {});
// Builds the model a weights file describes and loads its weights into it; `report` (when given)
// receives what a non-strict load found.
std::unique_ptr<models::CausalLM> load_model(const std::string& path, const LoadOptions& options = {},
                                             LoadReport* report = nullptr);
// Writes the model's parameters, architecture, config and (when given) tokenizer: attribute
// tokenizer = "char" | "byte", and for "char" an int32 dataset tokenizer/vocab of code points in
// id order. Tied parameters' other names are hard links.
void save_weights(const std::string& path, const models::CausalLM& model, const Tokenizer* tokenizer = nullptr);
// The same with each parameter's values from `values(name, parameter)` (called once per
// parameter, in named_parameters() order, the result written before the next call) instead of
// from the model: a model of empty parameters (nn::EmptyParameters) then gives the names, shapes
// and config, and one tensor at a time is in memory (kiln import).
using ParameterValues = std::function<HostTensor(const std::string& name, const Tensor& parameter)>;
// A parameter's values as f32 on the host (f64 and bf16 models converted; an f32 one is copied once).
HostTensor values_as_f32(const Tensor& parameter);
void save_weights(const std::string& path, const models::CausalLM& model, const ParameterValues& values,
                  const Tokenizer* tokenizer = nullptr);
// Writes any Module's parameters by name, without a config: load_weights reads them back into a
// module of the same structure.
void save_module_weights(const std::string& path, const nn::Module& module);
// The tokenizer stored with the weights, or nullopt for a file without one.
std::optional<Tokenizer> load_tokenizer(const std::string& path);

// The pieces weights files and checkpoints share: the model config as root attributes, and the
// tokenizer (attribute + tokenizer/vocab). read_tokenizer returns nullopt when none is stored.
namespace h5 {
class File;
}
void write_model_spec(h5::File& f, const models::CausalLM& model);
ModelSpec read_model_spec(const h5::File& f);  // every attribute checked against its architecture's range
// Throws naming the file, the dataset and the element when a float value is NaN or infinite.
void require_finite(const HostTensor& t, const std::string& file, const std::string& dataset);
// Both check that the tokenizer has exactly the model's vocab_size ids (read_tokenizer takes it
// from the file's config attributes).
void write_tokenizer(h5::File& f, const Tokenizer& tokenizer, int64_t vocab_size);
std::optional<Tokenizer> read_tokenizer(const h5::File& f);

// The dataset paths of `f` that are neither in `read` nor other names (hard links) of one in it,
// outside the tokenizer's group: what a strict load refuses.
std::vector<std::string> unread_datasets(const h5::File& f, const std::vector<std::string>& read);

// "transformer.h.0.ln_1.weight" -> "transformer/h/0/ln_1/weight".
std::string dataset_path(const std::string& parameter_name);

}  // namespace kiln
