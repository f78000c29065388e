// The interface every causal language model implements, and the registry of architectures that
// weights files and checkpoints can name. Training (train/trainer), weights and checkpoint files,
// sampling and the CLI take a CausalLM, so a new architecture needs only its file here and a
// registry entry.
// Shape contract: forward: token ids i32 (B, T), T <= block_size() -> logits (B, T, vocab_size()).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <kiln/layers/kv_cache.hpp>
#include <kiln/layers/module.hpp>

namespace kiln::models {

// A model's config as named numbers (the weights file's root attributes): sizes are integers,
// rates and bases reals. Kept in the order the architecture declares them.
class ModelAttributes {
 public:
  void set(const std::string& name, double value);
  bool has(const std::string& name) const;
  double get(const std::string& name) const;  // kiln::Error naming the attribute when absent
  int64_t get_int(const std::string& name) const { return static_cast<int64_t>(get(name)); }
  const std::vector<std::pair<std::string, double>>& items() const { return items_; }

 private:
  std::vector<std::pair<std::string, double>> items_;
};

class CausalLM : public nn::Module {
 public:
  virtual Tensor forward(const Tensor& idx) const = 0;
  // Mean cross-entropy of the next-token predictions against targets: i32 (B, T).
  Tensor loss(const Tensor& idx, const Tensor& targets) const;
  virtual std::string architecture() const = 0;  // a registry name: "gpt", "llama"
  virtual ModelAttributes attributes() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t block_size() const = 0;
  // Tied parameters listed once by named_parameters() but also known by another name, as
  // {other name, listed name}; weights files store the other name as a hard link.
  virtual std::vector<std::pair<std::string, std::string>> tied_names() const { return {}; }
  // Incremental decoding (sampling with a key/value cache): a cache for `batch` sequences of up to
  // block_size() tokens (null where the model has none), and the logits (B, 1, V) of one token
  // (B, 1) at `position`, i32 [1] (the tokens before it already decoded into the cache), whose
  // keys and values join the cache. The position is a tensor, an input of the step like the
  // token: one recording serves every step (train/sample.cpp traces it once and replays it).
  virtual std::unique_ptr<nn::KVCache> new_kv_cache(int64_t batch) const;
  virtual Tensor decode_step(const Tensor& token, const Tensor& position, nn::KVCache& cache) const;
  // The same at a position given as a number, first checked to lie inside the cache.
  Tensor decode_step(const Tensor& token, int64_t position, nn::KVCache& cache) const;
  // The model's own cache for `batch` sequences, made on first use and reused by later calls
  // (the engine's persistent storage is never given back, so a cache per call would grow it);
  // null where the model has none. Reuse is safe: a step writes its slot before attending, and
  // slots past the position are masked.
  nn::KVCache* reusable_kv_cache(int64_t batch) const;

 private:
  mutable std::unique_ptr<nn::KVCache> kv_cache_;
  mutable int64_t kv_cache_batch_ = 0;
};

// The checks every decode_step makes: token i32 (B, 1), position i32 [1] (its value, a runtime
// input, cannot be checked here: the caller keeps it inside the cache).
void check_decode_step(const CausalLM& model, const Tensor& token, const Tensor& position);

// One attribute of an architecture's config: integers must be whole; every value lies in
// [min, max) (reals may allow max itself); an attribute with a default may be absent from a file.
struct AttributeSpec {
  std::string name;
  bool integer = true;
  double min = 1, max = 2147483648.0;  // integers: a size in [1, 2^31)
  bool has_default = false;
  double default_value = 0;
  // The first weights and checkpoint format_version whose files must hold it (an attribute with a
  // default that an older file lacks takes the default): 3, when every attribute became required,
  // or the version that added it.
  int64_t required_from_version = 3;
};

struct Architecture {
  std::string name;
  std::string description;
  std::vector<AttributeSpec> attributes;
  std::function<std::unique_ptr<CausalLM>(const ModelAttributes&)> make;
};

// The registered architectures ("gpt", "llama").
const std::vector<Architecture>& architectures();
// kiln::Error listing the known names when `name` is not one of them.
const Architecture& architecture(const std::string& name);
// Checks every attribute against the architecture's specs (fills defaults) and builds the model,
// initialized from the engine's seed. `source` names where the attributes came from, for errors.
std::unique_ptr<CausalLM> make_model(const std::string& architecture, const ModelAttributes& attributes,
                                     const std::string& source = "model config");
// The attributes checked and completed with defaults; errors name `source` and the attribute.
// `file_version`: the format_version of the file they were read from, whose rules say which
// attributes must be present (AttributeSpec::required_from_version); 0: not from a file (every
// attribute with a default may be absent).
ModelAttributes check_attributes(const Architecture& arch, const ModelAttributes& attributes, const std::string& source,
                                 int64_t file_version = 0);

}  // namespace kiln::models
