// Autoregressive sampling with a fixed-size window.
#include "train/sample.hpp"

#include <cmath>

#include "circuit/ir/error.hpp"
#include "circuit/prims/philox.hpp"

namespace kiln {

std::string sample_text(const models::CausalLM& model, const Tokenizer& tokenizer, const std::string& prompt,
                        const SampleOptions& opts) {
  if (!(opts.temperature > 0.0)) throw Error("sample: temperature must be > 0");
  const int64_t block = model.block_size(), vocab = model.vocab_size();
  if (tokenizer.vocab_size() > vocab)
    throw Error("sample: the tokenizer has " + std::to_string(tokenizer.vocab_size()) + " tokens, the model " +
                std::to_string(vocab));
  std::vector<int32_t> ids = tokenizer.encode(prompt);
  if (ids.empty()) ids.push_back(0);
  const size_t prompt_len = ids.size();
  for (int64_t n = 0; n < opts.tokens; ++n) {
    // The last `block` tokens, padded on the right with id 0.
    size_t start = ids.size() > static_cast<size_t>(block) ? ids.size() - static_cast<size_t>(block) : 0;
    int64_t len = static_cast<int64_t>(ids.size() - start);
    HostTensor window = HostTensor::zeros(DType::i32, Shape{1, block});
    for (int64_t j = 0; j < len; ++j) window.data<int32_t>()[j] = ids[start + static_cast<size_t>(j)];
    HostTensor logits = model.forward(Tensor::from_host(window)).to_host();  // (1, block, V)
    const int64_t row = (len - 1) * vocab;
    const int64_t usable = tokenizer.vocab_size();
    double mx = -INFINITY;
    for (int64_t v = 0; v < usable; ++v) mx = std::max(mx, logits.get(row + v) / opts.temperature);
    std::vector<double> p(static_cast<size_t>(usable));
    double z = 0;
    for (int64_t v = 0; v < usable; ++v)
      z += p[static_cast<size_t>(v)] = std::exp(logits.get(row + v) / opts.temperature - mx);
    double u = bits_to_uniform(philox_bits(opts.seed, 3, static_cast<uint64_t>(n))) * z;
    int32_t next = static_cast<int32_t>(usable - 1);
    for (int64_t v = 0; v < usable; ++v) {
      u -= p[static_cast<size_t>(v)];
      if (u < 0) {
        next = static_cast<int32_t>(v);
        break;
      }
    }
    ids.push_back(next);
  }
  return tokenizer.decode(std::vector<int32_t>(ids.begin() + static_cast<int64_t>(prompt_len), ids.end()));
}

}  // namespace kiln
