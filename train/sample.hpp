// Sampling text from a GPT: autoregressive, temperature-scaled, with Philox draws (a seed
// reproduces the text). Every forward runs on a (1, block_size) window padded on the right,
// so one compiled plan serves every length (causal attention: padding after the last real
// token does not change its logits).
#pragma once

#include <string>

#include "models/gpt.hpp"
#include "train/tokenizer.hpp"

namespace kiln {

struct SampleOptions {
  int64_t tokens = 200;
  double temperature = 1.0;  // > 0; lower is greedier
  uint64_t seed = 1;
};

// Continues `prompt` (may be empty: starts from token 0) and returns only the new text.
std::string sample_text(const models::CausalLM& model, const Tokenizer& tokenizer, const std::string& prompt,
                        const SampleOptions& opts);

}  // namespace kiln
