// Fuzz target: a weights file (train/weights.hpp) read as `kiln sample` reads it: config,
// a model of that config, every parameter, the tokenizer.
#include <cmath>

#include "fuzz_input.hpp"
#include "models/gpt.hpp"
#include "train/tokenizer.hpp"
#include "train/weights.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  const std::string& path = fuzz::input_file(data, size);
  return fuzz::refuse_or_accept([&] {
    const models::GPTConfig c = read_weights_config(path);
    if (c.parameter_count() > fuzz::kMaxFuzzParameters) return;
    models::GPT model(c);
    load_weights(path, model);
    for (const auto& [name, p] : model.named_parameters())
      for (double v : p.to_vector()) fuzz::require(std::isfinite(v), "loaded weights are finite");
    if (std::optional<Tokenizer> tok = load_tokenizer(path))
      fuzz::require(tok->vocab_size() == c.vocab_size, "a loaded tokenizer fits the model's vocabulary");
  });
}
