// GPT model (GPT-2 architecture).
#include <cmath>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/models/gpt.hpp>

namespace kiln::models {

Block::Block(const GPTConfig& c) {
  double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  ln_1 = register_module("ln_1", std::make_shared<nn::LayerNorm>(c.n_embd, c.norm_eps));
  attn = register_module("attn", std::make_shared<nn::CausalSelfAttention>(c.n_embd, c.n_head, c.dropout, proj_std));
  ln_2 = register_module("ln_2", std::make_shared<nn::LayerNorm>(c.n_embd, c.norm_eps));
  mlp = register_module("mlp", std::make_shared<nn::MLP>(c.n_embd, c.dropout, proj_std, c.hidden()));
}

Tensor Block::forward(const Tensor& x) const {
  auto s = scope();
  Tensor y = x + attn->forward(ln_1->forward(x));
  return y + mlp->forward(ln_2->forward(y));
}

Tensor Block::decode(const Tensor& x, const Tensor& position, nn::KVCache::Layer& cache) const {
  auto s = scope();
  Tensor y = x + attn->decode(ln_1->forward(x), position, cache);
  return y + mlp->forward(ln_2->forward(y));
}

double GPTConfig::parameter_count() const {
  const double C = static_cast<double>(n_embd), H = static_cast<double>(hidden());
  // Per layer: attention 4C^2 + 4C, MLP 2CH + H + C, two LayerNorms 4C.
  return (static_cast<double>(vocab_size) + static_cast<double>(block_size)) * C +
         static_cast<double>(n_layer) * (4 * C * C + 2 * C * H + 9 * C + H) + 2 * C;
}

ModelAttributes GPTConfig::to_attributes() const {
  ModelAttributes a;
  a.set("vocab_size", static_cast<double>(vocab_size));
  a.set("block_size", static_cast<double>(block_size));
  a.set("n_layer", static_cast<double>(n_layer));
  a.set("n_head", static_cast<double>(n_head));
  a.set("n_embd", static_cast<double>(n_embd));
  a.set("dropout", dropout);
  a.set("ffn_hidden", static_cast<double>(hidden()));
  a.set("norm_eps", norm_eps);
  return a;
}

GPTConfig GPTConfig::from_attributes(const ModelAttributes& a) {
  GPTConfig c;
  c.vocab_size = a.get_int("vocab_size");
  c.block_size = a.get_int("block_size");
  c.n_layer = a.get_int("n_layer");
  c.n_head = a.get_int("n_head");
  c.n_embd = a.get_int("n_embd");
  c.dropout = a.has("dropout") ? a.get("dropout") : 0.0;
  // Attributes of format 4 (absent: GPT-2's 4 n_embd and 1e-5).
  c.ffn_hidden = a.has("ffn_hidden") ? a.get_int("ffn_hidden") : 0;
  c.norm_eps = a.has("norm_eps") ? a.get("norm_eps") : 1e-5;
  return c;
}

GPT::GPT(const GPTConfig& c) : config_(c) {
  if (c.vocab_size < 1 || c.block_size < 1 || c.n_layer < 1 || c.n_embd < 1)
    throw Error("GPT: vocab_size, block_size, n_layer and n_embd must be positive");
  // Training keeps each parameter 4 times (value, gradient, two AdamW moments) in f32: a model
  // whose parameters alone exceed the machine's memory is refused before building anything.
  const double params = c.parameter_count();
  const double physical = physical_memory_bytes();
  if (physical > 0 && 16 * params > physical && !nn::EmptyParameters::active())
    throw Error("GPT: " + std::to_string(c.n_layer) + " layers of width " + std::to_string(c.n_embd) + " have " +
                std::to_string(params / 1e9) + " billion parameters; training them needs " +
                std::to_string(16 * params / (1 << 30)) + " GiB, more than this machine's " +
                std::to_string(physical / (1 << 30)) + " GiB");
  transformer_ = register_module("transformer", std::make_shared<Transformer>());
  Transformer& t = *transformer_;
  t.wte = t.register_module("wte", std::make_shared<nn::Embedding>(c.vocab_size, c.n_embd));
  t.wpe = t.register_module("wpe", std::make_shared<nn::Embedding>(c.block_size, c.n_embd));
  t.drop = t.register_module("drop", std::make_shared<nn::Dropout>(c.dropout));
  auto blocks = t.register_module("h", std::make_shared<nn::Module>());
  for (int64_t i = 0; i < c.n_layer; ++i)
    t.h.push_back(blocks->register_module(std::to_string(i), std::make_shared<Block>(c)));
  t.ln_f = t.register_module("ln_f", std::make_shared<nn::LayerNorm>(c.n_embd, c.norm_eps));
  lm_head_ = register_module("lm_head", std::make_shared<TiedHead>());
  lm_head_->weight = lm_head_->register_parameter("weight", t.wte->weight);
}

std::unique_ptr<nn::KVCache> GPT::new_kv_cache(int64_t batch) const {
  const GPTConfig& c = config_;
  return std::make_unique<nn::KVCache>(c.n_layer, batch, c.n_head, c.block_size, c.n_embd / c.n_head,
                                       transformer_->wte->weight.dtype());
}

Tensor GPT::decode_step(const Tensor& token, const Tensor& position, nn::KVCache& cache) const {
  check_decode_step(*this, token, position);
  const Transformer& tr = *transformer_;
  // The position is an input (its row of wpe, its value as a scalar), not a constant: one plan
  // serves every step.
  Tensor x = tr.wte->forward(token) + tr.wpe->forward(position);
  const Tensor pos = reshape(cast(position, x.dtype()), Shape{});
  for (size_t i = 0; i < tr.h.size(); ++i) x = tr.h[i]->decode(x, pos, cache.layer(i));
  x = tr.ln_f->forward(x);
  Scope s("lm_head");
  return matmul(x, lm_head_->weight, false, true);  // (B, 1, V)
}

Tensor GPT::forward(const Tensor& idx) const {
  if (idx.dtype() != DType::i32 || idx.rank() != 2)
    throw Error("GPT.forward: expected token ids i32 (B, T), received " + std::string(dtype_name(idx.dtype())) +
                idx.shape().str());
  const int64_t t = idx.shape()[1];
  if (t > config_.block_size)
    throw Error("GPT.forward: sequence length " + std::to_string(t) + " exceeds block_size " +
                std::to_string(config_.block_size));
  const Transformer& tr = *transformer_;
  Tensor x = tr.drop->forward(tr.wte->forward(idx) + tr.wpe->forward(arange(t)));  // (B, T, C) + (T, C)
  for (const auto& block : tr.h) x = block->forward(x);
  x = tr.ln_f->forward(x);
  Scope s("lm_head");
  return matmul(x, lm_head_->weight, false, true);  // (B, T, V)
}

}  // namespace kiln::models
