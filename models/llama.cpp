// Llama model.
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/host_tensor.hpp>
#include <kiln/models/llama.hpp>

namespace kiln::models {

double LlamaConfig::parameter_count() const {
  const double C = static_cast<double>(n_embd), V = static_cast<double>(vocab_size);
  const double kv = static_cast<double>(n_kv_head) * C / static_cast<double>(n_head);
  const double H = static_cast<double>(hidden());
  const double layer = 2 * C * C + 2 * C * kv + 3 * C * H + 2 * C + (attention_bias ? 2 * C + 2 * kv : 0) +
                       (mlp_bias ? 2 * H + C : 0);
  return V * C * (tie_embeddings ? 1 : 2) + static_cast<double>(n_layer) * layer + C;
}

ModelAttributes LlamaConfig::to_attributes() const {
  ModelAttributes a;
  a.set("vocab_size", static_cast<double>(vocab_size));
  a.set("block_size", static_cast<double>(block_size));
  a.set("n_layer", static_cast<double>(n_layer));
  a.set("n_head", static_cast<double>(n_head));
  a.set("n_kv_head", static_cast<double>(n_kv_head));
  a.set("n_embd", static_cast<double>(n_embd));
  a.set("ffn_hidden", static_cast<double>(hidden()));
  a.set("rope_theta", rope_theta);
  a.set("norm_eps", norm_eps);
  a.set("tie_embeddings", tie_embeddings ? 1 : 0);
  a.set("attention_bias", attention_bias ? 1 : 0);
  a.set("mlp_bias", mlp_bias ? 1 : 0);
  a.set("rope_scaling_factor", rope_scaling.factor);
  a.set("rope_low_freq_factor", rope_scaling.low_freq_factor);
  a.set("rope_high_freq_factor", rope_scaling.high_freq_factor);
  a.set("rope_original_max_position", static_cast<double>(rope_scaling.original_max_position));
  return a;
}

LlamaConfig LlamaConfig::from_attributes(const ModelAttributes& a) {
  LlamaConfig c;
  c.vocab_size = a.get_int("vocab_size");
  c.block_size = a.get_int("block_size");
  c.n_layer = a.get_int("n_layer");
  c.n_head = a.get_int("n_head");
  c.n_kv_head = a.get_int("n_kv_head");
  c.n_embd = a.get_int("n_embd");
  c.ffn_hidden = a.get_int("ffn_hidden");
  c.rope_theta = a.get("rope_theta");
  c.norm_eps = a.get("norm_eps");
  c.tie_embeddings = a.get_int("tie_embeddings") != 0;
  // Attributes of format 4 (check_attributes fills their defaults; a bare ModelAttributes may
  // lack them).
  auto optional = [&](const char* name, double fallback) { return a.has(name) ? a.get(name) : fallback; };
  c.attention_bias = optional("attention_bias", 0) != 0;
  c.mlp_bias = optional("mlp_bias", 0) != 0;
  c.rope_scaling.factor = optional("rope_scaling_factor", 0);
  c.rope_scaling.low_freq_factor = optional("rope_low_freq_factor", 1);
  c.rope_scaling.high_freq_factor = optional("rope_high_freq_factor", 4);
  c.rope_scaling.original_max_position = static_cast<int64_t>(optional("rope_original_max_position", 8192));
  return c;
}

LlamaDecoderLayer::LlamaDecoderLayer(const LlamaConfig& c) {
  nn::AttentionOptions o;
  o.dim = c.n_embd, o.n_heads = c.n_head, o.n_kv_heads = c.n_kv_head, o.rope_theta = c.rope_theta;
  o.rope_scaling = c.rope_scaling, o.bias = c.attention_bias;
  self_attn = register_module("self_attn", std::make_shared<nn::MultiHeadAttention>(o));
  mlp = register_module("mlp", std::make_shared<nn::GatedMLP>(c.n_embd, c.hidden(), nn::GatedMLP::Activation::SiLU,
                                                                c.mlp_bias));
  input_layernorm = register_module("input_layernorm", std::make_shared<nn::RMSNorm>(c.n_embd, c.norm_eps));
  post_attention_layernorm =
      register_module("post_attention_layernorm", std::make_shared<nn::RMSNorm>(c.n_embd, c.norm_eps));
}

Tensor LlamaDecoderLayer::forward(const Tensor& x) const {
  auto s = scope();
  Tensor h = x + self_attn->forward(input_layernorm->forward(x));
  return h + mlp->forward(post_attention_layernorm->forward(h));
}

Tensor LlamaDecoderLayer::decode(const Tensor& x, const Tensor& position, nn::KVCache::Layer& cache) const {
  auto s = scope();
  Tensor h = x + self_attn->decode(input_layernorm->forward(x), position, cache);
  return h + mlp->forward(post_attention_layernorm->forward(h));
}

Llama::Llama(const LlamaConfig& c) : config_(c) {
  if (c.vocab_size < 1 || c.block_size < 1 || c.n_layer < 1 || c.n_embd < 1 || c.n_head < 1 || c.n_kv_head < 1)
    throw Error("Llama: vocab_size, block_size, n_layer, n_embd, n_head and n_kv_head must be positive");
  const double physical = physical_memory_bytes();
  if (physical > 0 && 16 * c.parameter_count() > physical && !nn::EmptyParameters::active())
    throw Error("Llama: " + std::to_string(c.parameter_count() / 1e9) + " billion parameters need " +
                std::to_string(16 * c.parameter_count() / (1 << 30)) + " GiB to train, more than this machine's " +
                std::to_string(physical / (1 << 30)) + " GiB");
  model_ = register_module("model", std::make_shared<Body>());
  model_->embed_tokens =
      model_->register_module("embed_tokens", std::make_shared<nn::Embedding>(c.vocab_size, c.n_embd));
  model_->layers = model_->register_module("layers", std::make_shared<nn::ModuleList<LlamaDecoderLayer>>());
  for (int64_t i = 0; i < c.n_layer; ++i) model_->layers->push_back(std::make_shared<LlamaDecoderLayer>(c));
  model_->norm = model_->register_module("norm", std::make_shared<nn::RMSNorm>(c.n_embd, c.norm_eps));
  lm_head_ = register_module("lm_head", std::make_shared<Head>());
  lm_head_->weight = c.tie_embeddings
                         ? lm_head_->register_parameter("weight", model_->embed_tokens->weight)
                         : lm_head_->register_parameter("weight", nn::normal_init({c.vocab_size, c.n_embd}, 0.02));
}

std::vector<std::pair<std::string, std::string>> Llama::tied_names() const {
  if (!config_.tie_embeddings) return {};
  return {{"lm_head.weight", "model.embed_tokens.weight"}};
}

std::unique_ptr<nn::KVCache> Llama::new_kv_cache(int64_t batch) const {
  const LlamaConfig& c = config_;
  return std::make_unique<nn::KVCache>(c.n_layer, batch, c.n_kv_head, c.block_size, c.n_embd / c.n_head,
                                       model_->embed_tokens->weight.dtype());
}

Tensor Llama::decode_step(const Tensor& token, const Tensor& position, nn::KVCache& cache) const {
  check_decode_step(*this, token, position);
  Tensor x = model_->embed_tokens->forward(token);  // (B, 1, C)
  const Tensor pos = reshape(cast(position, x.dtype()), Shape{});
  for (size_t i = 0; i < model_->layers->size(); ++i) x = (*model_->layers)[i]->decode(x, pos, cache.layer(i));
  x = model_->norm->forward(x);
  Scope s("lm_head");
  return matmul(x, lm_head_->weight, false, true);  // (B, 1, V)
}

Tensor Llama::forward(const Tensor& idx) const {
  if (idx.dtype() != DType::i32 || idx.rank() != 2)
    throw Error("Llama.forward: expected token ids i32 (B, T), received " + std::string(dtype_name(idx.dtype())) +
                idx.shape().str());
  if (idx.shape()[1] > config_.block_size)
    throw Error("Llama.forward: sequence length " + std::to_string(idx.shape()[1]) + " exceeds block_size " +
                std::to_string(config_.block_size));
  Tensor x = model_->embed_tokens->forward(idx);  // (B, T, C)
  for (const auto& layer : *model_->layers) x = layer->forward(x);
  x = model_->norm->forward(x);
  Scope s("lm_head");
  return matmul(x, lm_head_->weight, false, true);  // (B, T, V)
}

}  // namespace kiln::models
