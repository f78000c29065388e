// GPT with the GPT-2 architecture and nanoGPT's parameter names: token + learned position
// embeddings, pre-LayerNorm blocks x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)), a final ln_f
// and an lm_head tied to the token embedding (one parameter, listed as transformer.wte.weight).
// Shape contract: idx: i32 (B, T) with T <= block_size -> logits (B, T, vocab_size).
#pragma once

#include <kiln/layers/attention.hpp>
#include <kiln/layers/embedding.hpp>
#include <kiln/layers/layer_norm.hpp>
#include <kiln/layers/mlp.hpp>
#include <kiln/models/causal_lm.hpp>

namespace kiln::models {

struct GPTConfig {
  int64_t vocab_size = 65;
  int64_t block_size = 64;
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  double dropout = 0.0;
  int64_t ffn_hidden = 0;  // the MLP's width; 0: 4 n_embd (transformers: n_inner)
  double norm_eps = 1e-5;  // the LayerNorms' epsilon (transformers: layer_norm_epsilon)
  int64_t hidden() const { return ffn_hidden > 0 ? ffn_hidden : 4 * n_embd; }
  // The parameter count these sizes give (as a double: it may be astronomically large).
  double parameter_count() const;
  ModelAttributes to_attributes() const;
  static GPTConfig from_attributes(const ModelAttributes& a);
};

class Block : public nn::Module {
 public:
  explicit Block(const GPTConfig& c);
  Tensor forward(const Tensor& x) const;
  Tensor decode(const Tensor& x, const Tensor& position, nn::KVCache::Layer& cache) const;
  std::shared_ptr<nn::LayerNorm> ln_1, ln_2;
  std::shared_ptr<nn::CausalSelfAttention> attn;
  std::shared_ptr<nn::MLP> mlp;
};

class GPT : public CausalLM {
 public:
  // Initialized as GPT-2: N(0, 0.02) weights, residual projections N(0, 0.02 / sqrt(2 n_layer)),
  // zero biases, LayerNorm weight 1 and bias 0; from the engine's seed.
  explicit GPT(const GPTConfig& config);
  Tensor forward(const Tensor& idx) const override;
  std::string architecture() const override { return "gpt"; }
  ModelAttributes attributes() const override { return config_.to_attributes(); }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t block_size() const override { return config_.block_size; }
  std::vector<std::pair<std::string, std::string>> tied_names() const override {
    return {{"lm_head.weight", "transformer.wte.weight"}};
  }
  std::unique_ptr<nn::KVCache> new_kv_cache(int64_t batch) const override;
  using CausalLM::decode_step;
  Tensor decode_step(const Tensor& token, const Tensor& position, nn::KVCache& cache) const override;
  const GPTConfig& config() const { return config_; }

 private:
  struct Transformer : nn::Module {
    std::shared_ptr<nn::Embedding> wte, wpe;
    std::shared_ptr<nn::Dropout> drop;
    std::vector<std::shared_ptr<Block>> h;
    std::shared_ptr<nn::LayerNorm> ln_f;
  };
  struct TiedHead : nn::Module {
    Tensor weight;
  };
  GPTConfig config_;
  std::shared_ptr<Transformer> transformer_;
  std::shared_ptr<TiedHead> lm_head_;
};

}  // namespace kiln::models
