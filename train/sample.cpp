// Autoregressive sampling, with a key/value cache where the model has one.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/prims/philox.hpp>
#include <kiln/core/traced_step.hpp>
#include <kiln/train/sample.hpp>

namespace kiln {

namespace {

// The next token from logits[offset, offset + usable) at `temperature` (0: the most likely,
// the first of equals), restricted to the top_k most likely and then to the nucleus whose
// probability reaches top_p, with Philox draw n. The draw walks the kept tokens in id order, so
// that with neither restriction the text is what it always was for a seed.
int32_t draw(const HostTensor& logits, int64_t offset, int64_t usable, const SampleOptions& opts, int64_t n) {
  if (opts.temperature == 0) {
    int64_t best = 0;
    for (int64_t v = 1; v < usable; ++v)
      if (logits.get(offset + v) > logits.get(offset + best)) best = v;
    return static_cast<int32_t>(best);
  }
  double mx = -INFINITY;
  for (int64_t v = 0; v < usable; ++v) mx = std::max(mx, logits.get(offset + v) / opts.temperature);
  std::vector<double> p(static_cast<size_t>(usable));
  for (int64_t v = 0; v < usable; ++v)
    p[static_cast<size_t>(v)] = std::exp(logits.get(offset + v) / opts.temperature - mx);
  if ((opts.top_k > 0 && opts.top_k < usable) || opts.top_p < 1) {
    std::vector<int32_t> order(static_cast<size_t>(usable));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
    size_t keep = opts.top_k > 0 ? std::min<size_t>(order.size(), static_cast<size_t>(opts.top_k)) : order.size();
    double total = 0;
    for (size_t i = 0; i < keep; ++i) total += p[static_cast<size_t>(order[i])];
    if (opts.top_p < 1) {  // the fewest most likely tokens whose share of the kept mass reaches top_p
      double mass = 0;
      size_t nucleus = 0;
      while (nucleus < keep && mass < opts.top_p * total) mass += p[static_cast<size_t>(order[nucleus++])];
      keep = std::max<size_t>(1, nucleus);
    }
    for (size_t i = keep; i < order.size(); ++i) p[static_cast<size_t>(order[i])] = 0;
  }
  double z = 0;
  for (double x : p) z += x;
  double u = bits_to_uniform(philox_bits(opts.seed, 3, static_cast<uint64_t>(n))) * z;
  int32_t last = 0;
  for (int64_t v = 0; v < usable; ++v) {
    if (p[static_cast<size_t>(v)] == 0) continue;
    last = static_cast<int32_t>(v);
    u -= p[static_cast<size_t>(v)];
    if (u < 0) return last;
  }
  return last;
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

// One decode step of the model with its cache, recorded on the first call and replayed after:
// the token and the position are the trace's inputs, the cache's update is part of the step.
class ReplayedDecodeStep {
 public:
  ReplayedDecodeStep(const models::CausalLM& model, nn::KVCache& cache) : model_(model), cache_(cache) {}

  // The logits (1, 1, V) of `token` at `position` (inside the cache).
  HostTensor logits(int32_t token, int64_t position) {
    HostTensor t = HostTensor::zeros(DType::i32, Shape{1, 1}), p = HostTensor::zeros(DType::i32, Shape{1});
    t.data<int32_t>()[0] = token;
    p.data<int32_t>()[0] = static_cast<int32_t>(position);
    if (trace_) return trace_->run({t, p})[0].to_host();
    const Tensor token_in = Tensor::from_host(t), position_in = Tensor::from_host(p);
    trace_.emplace(std::vector<Tensor>{token_in, position_in}, [&] {
      const Tensor out = model_.decode_step(token_in, position_in, cache_);
      Engine::current().realize();
      return std::vector<Tensor>{out};
    });
    return trace_->outputs()[0].to_host();
  }

 private:
  const models::CausalLM& model_;
  nn::KVCache& cache_;
  std::optional<TracedStep> trace_;
};

// With a cache: each token is one decode step. When the cache is full, it restarts from the
// last block_size / 2 tokens (a window that slides by halves, so the cost stays one step per
// token on average).
void sample_cached(const models::CausalLM& model, nn::KVCache& cache, std::vector<int32_t>& ids, int64_t usable,
                   const SampleOptions& opts) {
  const int64_t block = model.block_size();
  ReplayedDecodeStep step(model, cache);
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
      logits = step.logits(ids[fed], position);
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
  if (!(opts.temperature >= 0.0) || std::isinf(opts.temperature))
    throw Error("sample: temperature must be finite and >= 0 (0: greedy), received " +
                std::to_string(opts.temperature));
  if (opts.top_k < 0) throw Error("sample: top_k must be >= 0 (0: off), received " + std::to_string(opts.top_k));
  if (!(opts.top_p > 0.0 && opts.top_p <= 1.0))
    throw Error("sample: top_p must lie in (0, 1] (1: off), received " + std::to_string(opts.top_p));
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
