// Llama (Touvron et al. 2023) with Hugging Face's parameter names, so that a kiln weights file
// loads strictly into transformers' LlamaForCausalLM (docs/FORMAT.md): pre-RMSNorm decoder
// layers x = x + self_attn(input_layernorm(x)); x = x + mlp(post_attention_layernorm(x)), with
// grouped-query attention and rotary embeddings (rotate-half form), a SwiGLU MLP, no biases, a
// final norm and an lm_head, optionally tied to the token embedding.
// Shape contract: idx: i32 (B, T) with T <= block_size -> logits (B, T, vocab_size).
#pragma once

#include <kiln/layers/embedding.hpp>
#include <kiln/layers/gated_mlp.hpp>
#include <kiln/layers/multi_head_attention.hpp>
#include <kiln/layers/rms_norm.hpp>
#include <kiln/models/causal_lm.hpp>

namespace kiln::models {

struct LlamaConfig {
  int64_t vocab_size = 65;
  int64_t block_size = 64;  // the longest sequence (transformers: max_position_embeddings)
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_kv_head = 2;   // divides n_head
  int64_t n_embd = 128;    // transformers: hidden_size
  int64_t ffn_hidden = 0;  // transformers: intermediate_size; 0: 8/3 n_embd rounded up to 32
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;  // transformers: rms_norm_eps
  bool tie_embeddings = false;
  bool attention_bias = false;  // biases on q/k/v/o_proj (transformers: attention_bias)
  bool mlp_bias = false;        // biases on gate/up/down_proj (transformers: mlp_bias)
  nn::RopeScaling rope_scaling;  // Llama 3.1's frequency rewrite (transformers: rope type "llama3")
  int64_t hidden() const { return ffn_hidden > 0 ? ffn_hidden : (8 * n_embd / 3 + 31) / 32 * 32; }
  double parameter_count() const;
  ModelAttributes to_attributes() const;
  static LlamaConfig from_attributes(const ModelAttributes& a);
};

class LlamaDecoderLayer : public nn::Module {
 public:
  explicit LlamaDecoderLayer(const LlamaConfig& c);
  Tensor forward(const Tensor& x) const;
  Tensor decode(const Tensor& x, const Tensor& position, nn::KVCache::Layer& cache) const;
  std::shared_ptr<nn::MultiHeadAttention> self_attn;
  std::shared_ptr<nn::GatedMLP> mlp;
  std::shared_ptr<nn::RMSNorm> input_layernorm, post_attention_layernorm;
};

class Llama : public CausalLM {
 public:
  // Initialized as transformers does: every weight N(0, 0.02), norms 1; from the engine's seed.
  explicit Llama(const LlamaConfig& config);
  Tensor forward(const Tensor& idx) const override;
  std::string architecture() const override { return "llama"; }
  ModelAttributes attributes() const override { return config_.to_attributes(); }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t block_size() const override { return config_.block_size; }
  std::vector<std::pair<std::string, std::string>> tied_names() const override;
  std::unique_ptr<nn::KVCache> new_kv_cache(int64_t batch) const override;
  using CausalLM::decode_step;
  Tensor decode_step(const Tensor& token, const Tensor& position, nn::KVCache& cache) const override;
  const LlamaConfig& config() const { return config_; }

  struct Body : nn::Module {
    std::shared_ptr<nn::Embedding> embed_tokens;
    std::shared_ptr<nn::ModuleList<LlamaDecoderLayer>> layers;
    std::shared_ptr<nn::RMSNorm> norm;
  };
  const Body& body() const { return *model_; }

 private:
  struct Head : nn::Module {
    Tensor weight;
  };
  LlamaConfig config_;
  std::shared_ptr<Body> model_;
  std::shared_ptr<Head> lm_head_;
};

}  // namespace kiln::models
