// Autoregressive sampling, with a key/value cache where the model has one.
#include <cmath>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/prims/philox.hpp>
#include <kiln/train/sample.hpp>

namespace kiln {

namespace {

// The next token from logits[offset, offset + usable) at `temperature`, with Philox draw n.
int32_t draw(const HostTensor& logits, int64_t offset, int64_t usable, const SampleOptions& opts, int64_t n) {
  double mx = -INFINITY;
  for (int64_t v = 0; v < usable; ++v) mx = std::max(mx, logits.get(offset + v) / opts.temperature);
  std::vector<double> p(static_cast<size_t>(usable));
  double z = 0;
  for (int64_t v = 0; v < usable; ++v)
    z += p[static_cast<size_t>(v)] = std::exp(logits.get(offset + v) / opts.temperature - mx);
  double u = bits_to_uniform(philox_bits(opts.seed, 3, static_cast<uint64_t>(n))) * z;
  for (int64_t v = 0; v < usable; ++v) {
    u -= p[static_cast<size_t>(v)];
    if (u < 0) return static_cast<int32_t>(v);
  }
  return static_cast<int32_t>(usable - 1);
}

// Without a cache: every token runs the model on a (1, block_size) window of the last tokens,
// padded on the right, so one compiled plan serves every length (causal attention: padding
// after the last real token does not change its logits).
void sample_windowed(const models::CausalLM& model, std::vector<int32_t>& ids, int64_t usable,
                     const SampleOptions& opts) {
  const int64_t block = model.block_size(), vocab = model.vocab_size();
  for (int64_t n = 0; n < opts.tokens; ++n) {
    const size_t start = ids.size() > static_cast<size_t>(block) ? ids.size() - static_cast<size_t>(block) : 0;
    const int64_t len = static_cast<int64_t>(ids.size() - start);
    HostTensor window = HostTensor::zeros(DType::i32, Shape{1, block});
    for (int64_t j = 0; j < len; ++j) window.data<int32_t>()[j] = ids[start + static_cast<size_t>(j)];
    HostTensor logits = model.forward(Tensor::from_host(window)).to_host();  // (1, block, V)
    ids.push_back(draw(logits, (len - 1) * vocab, usable, opts, n));
  }
}

// With a cache: each token is one decode step. When the cache is full, it restarts from the
// last block_size / 2 tokens (a window that slides by halves, so the cost stays one step per
// token on average).
void sample_cached(const models::CausalLM& model, nn::KVCache& cache, std::vector<int32_t>& ids, int64_t usable,
                   const SampleOptions& opts) {
  const int64_t block = model.block_size();
  int64_t position = 0;
  size_t fed = 0;  // ids[0, fed) went through the model; the cache holds the last `position` of them
  HostTensor logits;
  auto catch_up = [&] {
    while (fed < ids.size()) {
      if (position == block) {
        const size_t keep = static_cast<size_t>(std::max<int64_t>(1, block / 2));
        fed -= keep;
        position = 0;
      }
      logits = model.decode_step(Tensor::from_ints({ids[fed]}, {1, 1}), position, cache).to_host();  // (1, 1, V)
      ++fed, ++position;
    }
  };
  for (int64_t n = 0; n < opts.tokens; ++n) {
    catch_up();
    ids.push_back(draw(logits, 0, usable, opts, n));
  }
}

}  // namespace

std::string sample_text(const models::CausalLM& model, const Tokenizer& tokenizer, const std::string& prompt,
                        const SampleOptions& opts) {
  if (!(opts.temperature > 0.0)) throw Error("sample: temperature must be > 0");
  if (tokenizer.vocab_size() > model.vocab_size())
    throw Error("sample: the tokenizer has " + std::to_string(tokenizer.vocab_size()) + " tokens, the model " +
                std::to_string(model.vocab_size()));
  std::vector<int32_t> ids = tokenizer.encode(prompt);
  if (ids.empty()) ids.push_back(0);
  const size_t prompt_len = ids.size();
  nn::KVCache* cache = opts.kv_cache ? model.reusable_kv_cache(1) : nullptr;
  if (cache)
    sample_cached(model, *cache, ids, tokenizer.vocab_size(), opts);
  else
    sample_windowed(model, ids, tokenizer.vocab_size(), opts);
  return tokenizer.decode(std::vector<int32_t>(ids.begin() + static_cast<int64_t>(prompt_len), ids.end()));
}

}  // namespace kiln
