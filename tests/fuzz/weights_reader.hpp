// How the weights fuzz targets read a file: as `kiln sample` does (config, a model of that
// config, every parameter, the tokenizer), with the properties an accepted file must have.
#pragma once

#include <cmath>
#include <string>

#include <kiln/models/gpt.hpp>
#include <kiln/train/tokenizer.hpp>
#include <kiln/train/weights.hpp>

#include "fuzz_input.hpp"

namespace kiln::fuzz {

inline void read_weights_as_sample(const std::string& path) {
  const models::GPTConfig c = read_weights_config(path);
  if (c.parameter_count() > kMaxFuzzParameters) return;
  models::GPT model(c);
  load_weights(path, model);
  for (const auto& [name, p] : model.named_parameters())
    for (double v : p.to_vector()) require(std::isfinite(v), "loaded weights are finite");
  if (std::optional<Tokenizer> tok = load_tokenizer(path))
    require(tok->vocab_size() == c.vocab_size, "a loaded tokenizer covers the model's vocabulary");
}

}  // namespace kiln::fuzz
