// Sampling text from a causal language model: autoregressive, temperature-scaled (0: greedy),
// optionally limited to the top k tokens and to the nucleus of probability top_p, with Philox
// draws (a seed reproduces the text). With a key/value cache (the default, where the model has
// one) each new token costs one decode step of one token, recorded once and replayed (a
// TracedStep: no recording or plan lookup per token); without, each token runs the model on a
// (1, block_size) window. Both give the same text while the sequence fits the block; past it, the
// window slides by one token, the cache restarts from the last block_size / 2 tokens.
#pragma once

#include <string>

#include <kiln/models/gpt.hpp>
#include <kiln/train/tokenizer.hpp>

namespace kiln {

struct SampleOptions {
  int64_t tokens = 200;
  double temperature = 1.0;  // >= 0; lower is greedier, 0 takes the most likely token
  int64_t top_k = 0;         // > 0: draw among the k most likely tokens only
  double top_p = 1.0;        // in (0, 1]: draw among the fewest most likely tokens whose probability reaches it
  uint64_t seed = 1;
  bool kv_cache = true;  // use the model's key/value cache where it has one
};

// Continues `prompt` (may be empty: starts from token 0) and returns only the new text.
std::string sample_text(const models::CausalLM& model, const Tokenizer& tokenizer, const std::string& prompt,
                        const SampleOptions& opts);

}  // namespace kiln
